//! pedelec-native-host: the browser's bridge to Core.
//!
//! Chrome starts it per `connectNative` port with the extension's origin as
//! its argument ([`caller`]); it relays native-messaging frames to Core over
//! gRPC ([`relay`]) over its pipes ([`stdio`]), starting Core when needed
//! ([`core_link`]). It also registers itself with browsers ([`registration`]).

pub mod caller;
pub mod core_link;
pub mod registration;
pub mod relay;
pub mod stdio;
