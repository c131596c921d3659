// Migrations are embedded by `sqlx::migrate!`: a changed migration must rebuild the server.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
