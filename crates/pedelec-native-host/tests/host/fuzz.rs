//! Arbitrary bytes into the host's input loop: no panic, no hang.

use std::time::Duration;

use pedelec_native_host::relay::{self, Exit};
use proptest::prelude::*;

fn run(input: Vec<u8>) -> Exit {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            relay::run(std::io::Cursor::new(input), tokio::io::sink(), relay::settled(None)),
        )
        .await
        .expect("the relay never hangs on finite input")
    })
}

/// Frames that are structurally valid, with arbitrary JSON-ish payloads.
fn framed(payloads: Vec<String>) -> Vec<u8> {
    payloads
        .iter()
        .flat_map(|p| {
            let mut f = (p.len() as u32).to_le_bytes().to_vec();
            f.extend_from_slice(p.as_bytes());
            f
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(input in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let exit = run(input);
        prop_assert!(matches!(exit, Exit::InputClosed | Exit::BadInput(_)), "{exit:?}");
    }

    #[test]
    fn arbitrary_frames(payloads in proptest::collection::vec("[{}\\[\\]\":,a-zA-Z0-9 ]{0,64}", 0..32)) {
        let exit = run(framed(payloads));
        prop_assert_eq!(exit, Exit::InputClosed);
    }

    #[test]
    fn requests_with_random_fields(ids in proptest::collection::vec(any::<u32>(), 0..32), kind in "[a-zA-Z]{1,12}") {
        let payloads = ids.iter().map(|id| format!(r#"{{"requestId":{id},"request":{{"{kind}":{{}}}}}}"#)).collect();
        prop_assert_eq!(run(framed(payloads)), Exit::InputClosed);
    }
}
