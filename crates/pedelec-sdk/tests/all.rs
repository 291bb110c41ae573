//! One integration-test binary: a real Core daemon on a temporary socket,
//! driven through the real SDK (and, for bad input, a raw gRPC client).

mod suite;
