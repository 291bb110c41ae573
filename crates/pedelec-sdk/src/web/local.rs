//! [`Local`]: lets a JS handle (or a future holding one) cross the SDK's
//! `Send` bounds.
//!
//! The `Transport` trait, the handler types and the session shell all require
//! `Send`, because natively they run on a multi-threaded tokio runtime. JS
//! values are `!Send`. Rather than cfg'ing `Send` away across `transport.rs`,
//! `session/`, `tool.rs` and every crate that implements or calls them (the
//! native host uses the trait too), the browser build wraps its JS handles
//! here, so the session logic compiles unchanged. It is sound because the
//! browser build is single-threaded: without the `atomics` target feature,
//! wasm32-unknown-unknown has exactly one thread, and a threaded build is
//! refused at compile time below.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

#[cfg(target_feature = "atomics")]
compile_error!("pedelec-sdk's web build assumes single-threaded wasm: JS handles must never change threads");

/// A value that is only ever touched from the one wasm thread.
pub struct Local<T>(pub T);

// SAFETY: see the module docs — there is no second thread to send it to.
unsafe impl<T> Send for Local<T> {}
// SAFETY: as above; no other thread can hold a reference.
unsafe impl<T> Sync for Local<T> {}

impl<F: Future> Future for Local<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: structural pinning; the inner future is never moved out of `Local`.
        unsafe { self.map_unchecked_mut(|local| &mut local.0) }.poll(cx)
    }
}
