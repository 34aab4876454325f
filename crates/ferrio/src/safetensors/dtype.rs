//! The element types of the safetensors format: their names as the header spells them and their
//! widths in bits. Pure data; knows nothing of files or JSON.

use std::fmt;
use std::str::FromStr;

/// One element type of a safetensors file.
///
/// The variants are in the order of safetensors' own enum. That order is part of the format's
/// output, not a detail: `safetensors` writes tensors sorted by dtype, largest variant first,
/// and [`super::header_bytes`] sorts the same way so that its bytes equal safetensors' bytes.
// The variants keep the format's own spelling, so a name in a header reads as the variant.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Dtype {
    /// Boolean, one byte per element.
    BOOL,
    /// 4-bit float (E2M1), two elements per byte.
    F4,
    /// 6-bit float (E2M3), packed.
    F6_E2M3,
    /// 6-bit float (E3M2), packed.
    F6_E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// 8-bit float, E5M2.
    F8_E5M2,
    /// 8-bit float, E4M3 (finite, NaN only).
    F8_E4M3,
    /// 8-bit exponent-only float (E8M0), the scale type of MX formats.
    F8_E8M0,
    /// 8-bit float, E4M3 with unsigned zero and NaN.
    F8_E4M3FNUZ,
    /// 8-bit float, E5M2 with unsigned zero and NaN.
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// Complex of two single-precision floats.
    C64,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// Every dtype, in safetensors' enum order.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Width of one element in bits (4 and 6 for the packed float types).
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6_E2M3 | Dtype::F6_E3M2 => 6,
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8_E5M2
            | Dtype::F8_E4M3
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E5M2FNUZ => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }

    /// The name the header uses (`"BF16"`, `"F8_E4M3"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::F4 => "F4",
            Dtype::F6_E2M3 => "F6_E2M3",
            Dtype::F6_E3M2 => "F6_E3M2",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Bytes that `elements` elements occupy, or `None` when they do not fill whole bytes (an
    /// odd number of F4 elements, say) or the count overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let bits = elements.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// Why [`Dtype::bytes_for`] has no answer for `elements`, as the end of a sentence.
    pub(crate) fn why_no_bytes(self, elements: u64) -> String {
        if elements.checked_mul(self.bits()).is_none() {
            format!("{elements} elements of {self}, more bits than fit in 64 bits")
        } else {
            format!("{elements} elements of {self}, which do not fill whole bytes")
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a dtype name: the name is not one of the 22.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDtype(pub String);

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        write!(
            f,
            "unknown dtype {:?}: expected one of {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownDtype {}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDtype(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_order_is_the_enum_order() {
        for (i, d) in Dtype::ALL.iter().enumerate() {
            assert_eq!(d.name().parse::<Dtype>(), Ok(*d));
            if i > 0 {
                assert!(Dtype::ALL[i - 1] < *d);
            }
        }
        assert!("f32".parse::<Dtype>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(Dtype::F4.bytes_for(3), None);
        assert_eq!(Dtype::F4.bytes_for(4), Some(2));
        assert_eq!(Dtype::F6_E2M3.bytes_for(4), Some(3));
        assert_eq!(Dtype::BF16.bytes_for(5), Some(10));
        assert_eq!(Dtype::U64.bytes_for(u64::MAX), None);
        assert!(Dtype::F64
            .why_no_bytes(1 << 61)
            .contains("more bits than fit"));
        assert!(Dtype::F4.why_no_bytes(3).contains("whole bytes"));
    }
}
