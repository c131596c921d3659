//! One integration-test binary: the real server on 127.0.0.1:0, driven over HTTP through the
//! real client.

mod blobs;
mod support;
mod read;
mod streams;
mod ops;
mod retention;
mod crash;
