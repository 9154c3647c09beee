//! The node directory, over TLS, connects to a node only if the certificate at the
//! address meta gave proves that node's id: another holder of a node certificate of
//! the cluster listening there is refused.

use bytes::Bytes;
use net::pki::Ca;
use net::{NetError, NodeDirectory, Peer, Role, Security, Service, Tls};
use proto::types::NodeInfo;
use std::sync::Arc;
use std::time::Duration;

struct Nothing;
impl Service for Nothing {
    type Request = ();
    type Reply = ();
    async fn handle(self: Arc<Self>, _peer: Peer, _req: (), _bulk: Bytes) -> ((), Bytes) {
        ((), Bytes::new())
    }
}

fn tls(ca: &Ca, role: Role, name: &str) -> Arc<Tls> {
    let issued = ca.issue(role, name, "a", 1).unwrap();
    Arc::new(Tls::from_pem(ca.cert_pem().as_bytes(), issued.cert_pem.as_bytes(), issued.key_pem.as_bytes()).unwrap())
}

fn info(id: &str, addr: &str) -> NodeInfo {
    NodeInfo {
        id: id.into(),
        site: "a".into(),
        addr: addr.into(),
        capacity_bytes: 0,
        used_bytes: 0,
        chunk_count: 0,
        last_seen_secs: 0,
        store_id: String::new(),
        site_rtts: Vec::new(),
        cache_bytes: 0,
        drained: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_must_prove_the_id_it_is_listed_under() {
    let ca = Ca::create("directory").unwrap();
    net::secure(Security::Tls(tls(&ca, Role::Client, "mount-host")));
    let mut addrs = Vec::new();
    for name in ["n1", "impostor"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        tokio::spawn(net::serve_as(
            listener,
            Arc::new(Nothing),
            net::Limits::default(),
            Some(tls(&ca, Role::Node, name)),
        ));
    }
    let dir = NodeDirectory::new(Duration::from_secs(5), Box::new(|_| 1));
    dir.update([info("n1", &addrs[0]), info("n2", &addrs[1])]);
    let n1 = dir.client("n1").await.unwrap();
    assert_eq!(n1.server_identity().await.unwrap().name, "n1");
    match dir.client("n2").await {
        Err(NetError::Refused { reason, .. }) => assert!(reason.contains("not node n2"), "{reason}"),
        other => panic!("an impostor was accepted as n2: {:?}", other.map(|_| ())),
    }
}
