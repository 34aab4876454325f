//! The `ferrio` command line.

fn main() {
    // While the process has one thread, growing the descriptor table is free; later a remote
    // read's sockets would wait for it to grow (`ferrio::remote::reserve_sockets`).
    ferrio::remote::reserve_sockets();
    std::process::exit(ferrio_cli::run(std::env::args_os().collect()));
}
