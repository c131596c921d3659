//! The HTTP edge: the accept loop and its limits (`listen`), the router and its layers with
//! one file per resource's handlers (`routes/`), the request log (`reqlog`, `logwriter`),
//! what answers are written with (`json`, `cursor`), and serving beside the background
//! passes (`server`). Handlers extract, call a service, answer; policy lives in the services.

pub mod cursor;
pub mod json;
pub mod listen;
pub mod logwriter;
pub mod reqlog;
pub mod routes;
pub mod server;
