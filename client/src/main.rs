//! `spillway`: parses the command line and calls the SDK.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    spillway_client::cli::run(spillway_client::cli::Cli::parse()).await
}
