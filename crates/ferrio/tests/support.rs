//! Helpers shared by the test modules: test data, and the rule for tests that need a GPU.

/// Fails the calling test, saying why, when CUDA cannot be used here: GPU tests are ignored
/// unless asked for, and a GPU test asked for on a machine without one must not pass.
#[macro_export]
macro_rules! require_cuda {
    () => {
        if let Err(e) = ferrio::cuda::available() {
            panic!("this test needs a CUDA GPU and none can be used here: {e}");
        }
    };
}

/// `len` pseudo-random bytes from `seed` (xorshift64*): reproducible, and never a run of zeros
/// that a missing copy could match.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A non-zero, position-dependent pattern to fill destinations with before a transfer.
pub fn poison(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) as u8) ^ 0xA5 | 0x01)
        .collect()
}

/// Index of the first differing byte, for assertion messages.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or(if a.len() == b.len() {
            None
        } else {
            Some(a.len().min(b.len()))
        })
}

/// Asserts two byte ranges are equal, naming the first differing byte instead of dumping both.
#[track_caller]
pub fn assert_bytes_eq(actual: &[u8], expected: &[u8], what: &str) {
    if let Some(i) = first_difference(actual, expected) {
        panic!(
            "{what}: first difference at byte {i} of {} (actual {:?}, expected {:?})",
            expected.len(),
            actual.get(i),
            expected.get(i)
        );
    }
}
