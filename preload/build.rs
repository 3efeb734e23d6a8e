//! Link flags of `libhami_preload.so`.
//!
//! `-z norelro`: no separate read-only-after-relocation segment. With RELRO the loader maps one
//! more segment and calls `mprotect` once more for this library in every exec (measured: about
//! 7 µs of the library's cost, bench/preload/). What RELRO protects here is the library's own GOT,
//! which only the constructor uses, before `main`; the program's and glibc's RELRO are unchanged.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,norelro");
}
