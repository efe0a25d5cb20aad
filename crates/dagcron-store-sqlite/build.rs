//! The migrations are embedded by `sqlx::migrate!`, which cannot tell cargo
//! to watch them on a stable compiler: a new migration must rebuild the crate.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
