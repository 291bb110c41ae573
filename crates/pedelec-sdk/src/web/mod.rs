//! The browser build (`--features web`, wasm32-unknown-unknown): the seed's
//! JavaScript API through wasm-bindgen ([`api`]), over a port to the Pedelec
//! extension that carries native-messaging frames ([`port`]), with asset
//! bytes moved by `fetch` ([`assets`]). The session logic is the crate's own
//! [`crate::session`] and [`crate::machine`], unchanged; [`local`] explains how
//! JS handles meet the SDK's `Send` bounds.

pub mod api;
mod assets;
mod js;
pub mod local;
pub mod port;

pub use api::{JsPedelec, JsPedelecSession};
