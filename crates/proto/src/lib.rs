//! Every type that crosses a process boundary (wire) or is persisted (disk), and the
//! frame codec that carries them. Nothing here does I/O, so every other crate can
//! share these definitions and the decoders can be fuzzed in isolation.

/// The request enum of a protocol's table (one newtype variant per request struct),
/// its kinds, and the lookups every table shares (`name`, `kind`, `facts`); each
/// table's macro (`meta_requests!`, `node_requests!`) adds the facts of its own.
macro_rules! request_enum {
    ($(#[$edoc:meta])* $enum:ident, $(#[$kdoc:meta])* $kind:ident, $facts:ty; $( $(#[$doc:meta])* $name:ident, )*) => {
        $(
            impl From<$name> for $enum {
                fn from(r: $name) -> Self {
                    $enum::$name(r)
                }
            }
        )*

        $(#[$kdoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $kind {
            $( $name, )*
        }

        impl $kind {
            /// Every request, in the table's order.
            pub const ALL: &[$kind] = &[$( $kind::$name, )*];
        }

        $(#[$edoc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $enum {
            $( $(#[$doc])* $name($name), )*
        }

        impl $enum {
            /// The request's name, for messages and logs.
            pub fn name(&self) -> &'static str {
                match self {
                    $( $enum::$name(_) => stringify!($name), )*
                }
            }

            /// Which request this is.
            pub fn kind(&self) -> $kind {
                match self {
                    $( $enum::$name(_) => $kind::$name, )*
                }
            }

            /// The request's facts, as the table states them.
            pub fn facts(&self) -> &'static $facts {
                self.kind().facts()
            }
        }
    };
}

/// Every answer type of a protocol as one enum on the wire: `Done` (the answer of
/// `()`), the unit answers listed, and a variant per distinct answer type, each
/// convertible to and from its type.
macro_rules! reply_enum {
    ($(#[$edoc:meta])* $enum:ident; $( $(#[$udoc:meta])* $unit:ident, )*; $( $(#[$doc:meta])* $variant:ident($ty:ty), )*) => {
        $(#[$edoc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $enum {
            /// The request was carried out; nothing to return.
            Done,
            $( $(#[$udoc])* $unit, )*
            $( $(#[$doc])* $variant($ty), )*
        }

        $(
            impl From<$ty> for $enum {
                fn from(v: $ty) -> Self {
                    $enum::$variant(v)
                }
            }

            impl TryFrom<$enum> for $ty {
                type Error = $enum;
                fn try_from(r: $enum) -> Result<Self, $enum> {
                    match r {
                        $enum::$variant(v) => Ok(v),
                        other => Err(other),
                    }
                }
            }
        )*

        impl From<()> for $enum {
            fn from((): ()) -> Self {
                $enum::Done
            }
        }

        impl TryFrom<$enum> for () {
            type Error = $enum;
            fn try_from(r: $enum) -> Result<(), $enum> {
                match r {
                    $enum::Done => Ok(()),
                    other => Err(other),
                }
            }
        }
    };
}

pub mod cap;
pub mod error;
pub mod extent;
pub mod frame;
pub mod meta;
pub mod node;
pub mod placement;
pub mod policy;
pub mod types;

/// Version of the RPC protocol; meta refuses a `Hello` that names any other version
/// (an exact match: there are no compatible minor versions yet).
pub const PROTOCOL_VERSION: u32 = 11;

/// A typed request: the wire form it travels in and what its caller gets back, so a
/// transport can offer one typed `ask` for every protocol.
pub trait Call {
    /// The request as it travels (a protocol's request enum).
    type Wire: serde::Serialize;
    /// The answer as it travels.
    type Answer: serde::de::DeserializeOwned;
    /// What the caller gets from a successful answer.
    type Output;
    fn into_wire(self) -> Self::Wire;
    /// Unpacks the answer; a refusal or an answer of the wrong kind is an error.
    fn output(answer: Self::Answer) -> Result<Self::Output, error::WireError>;
}
