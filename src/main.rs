//! The `toolgate` binary: everything happens in [`toolgate::cli::main`].

/// jemalloc rather than glibc's malloc: a burst of connects (every session
/// at start, or many tenants activated at once) holds far more memory than
/// the idle sessions it leaves, and glibc keeps most of that peak mapped
/// among the long-lived allocations, while jemalloc's background thread
/// returns it (`.cargo/config.toml`; docs/performance.md, "Idle pairs").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    toolgate::cli::main()
}
