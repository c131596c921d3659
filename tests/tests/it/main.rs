//! One integration-test binary: the real server on 127.0.0.1:0, driven over HTTP through the
//! real client.

mod blobs;
mod contract;
mod crash;
mod http;
mod ops;
mod read;
mod replicas;
mod retention;
mod streams;
mod support;
mod ui;
