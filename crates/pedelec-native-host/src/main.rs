//! pedelec-native-host: bridges Chrome native messaging to Core (not built yet; see ARCHITECTURE.md).

fn main() {
    eprintln!("pedelec-native-host is not implemented yet");
    std::process::exit(2);
}
