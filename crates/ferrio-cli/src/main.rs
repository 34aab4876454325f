//! The `ferrio` command line.

fn main() {
    std::process::exit(ferrio_cli::run(std::env::args_os().collect()));
}
