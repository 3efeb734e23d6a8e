//! `hami-webhook`: everything is in the library ([`hami_webhook::app`]).

fn main() -> std::process::ExitCode {
    hami_webhook::app::main()
}
