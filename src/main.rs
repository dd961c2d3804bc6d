//! The `toolgate` binary: everything happens in [`toolgate::cli::main`].

fn main() -> std::process::ExitCode {
    toolgate::cli::main()
}
