//! `xlb`: the agent and the tools around it (subcommands in `cli/`).

mod cli;

/// Errors are the user's to read: the message and its causes on one line, never a backtrace
/// (even with RUST_BACKTRACE set), and exit status 1.
fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlb: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
