//! The conformance suite driven from outside the `meta` crate, as a backend in another
//! crate would: its own factory (here over `open_store`; another backend hands its
//! connections to `Store::new`) and `MetaService::with_store`, with one test per case
//! from `meta::conformance_tests!`. Needs `--features conformance`.

use meta::MetaService;
use meta::conformance::{Factory, test_config};
use std::sync::Arc;

/// A backend assembled the way an outside crate does it: open its connections, give
/// them to the shared engine, serve a `MetaService` over it.
struct External {
    dir: tempfile::TempDir,
}

impl Factory for External {
    fn open(&self) -> Arc<MetaService> {
        let config = test_config(self.dir.path().join("meta.db"));
        let url = format!("sqlite://{}", config.db_url);
        let store = meta::open_store(&url, None, true, None, meta::DEFAULT_DB_TIMEOUT).expect("open store");
        MetaService::with_store(Arc::new(store), &config)
    }
}

fn external() -> External {
    External { dir: tempfile::tempdir().expect("tempdir") }
}

mod conformance {
    meta::conformance_tests!(super::external);
}
