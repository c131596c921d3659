//! One integration-test binary: the real server on 127.0.0.1:0, driven over HTTP through the
//! real client.

mod attacks;
mod blobs;
mod contract;
mod crash;
mod hardening;
mod http;
mod inputs;
mod integrity;
mod ops;
mod plans;
mod races;
mod read;
mod redact;
mod replicas;
mod retention;
mod search;
mod storage;
mod streams;
mod stress;
mod support;
mod ui;
