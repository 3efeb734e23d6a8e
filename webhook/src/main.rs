//! `hami-webhook`: everything is in the library ([`hami_webhook::shell::app`]).

fn main() -> std::process::ExitCode {
    hami_webhook::shell::app::main()
}
