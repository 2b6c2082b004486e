//! Every kind of call a `Hasher` takes, as data: the hasher's tests (`src/hasher.rs` and
//! `tests/review_hasher.rs`) replay one sequence into several hashers and compare.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

/// One call of a `Hasher`, of each kind it has, or a key type's own `Hash`.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    Bytes(Vec<u8>),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    U128(u128),
    Usize(usize),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    I128(i128),
    Isize(isize),
    Str(String),
    Ip(IpAddr),
    /// A `finish` between writes, which must change nothing.
    Finish,
}

impl Write {
    pub(crate) fn apply(&self, hasher: &mut impl Hasher) {
        match self {
            Write::Bytes(bytes) => hasher.write(bytes),
            Write::U8(value) => hasher.write_u8(*value),
            Write::U16(value) => hasher.write_u16(*value),
            Write::U32(value) => hasher.write_u32(*value),
            Write::U64(value) => hasher.write_u64(*value),
            Write::U128(value) => hasher.write_u128(*value),
            Write::Usize(value) => hasher.write_usize(*value),
            Write::I8(value) => hasher.write_i8(*value),
            Write::I16(value) => hasher.write_i16(*value),
            Write::I32(value) => hasher.write_i32(*value),
            Write::I64(value) => hasher.write_i64(*value),
            Write::I128(value) => hasher.write_i128(*value),
            Write::Isize(value) => hasher.write_isize(*value),
            Write::Str(text) => text.hash(hasher),
            Write::Ip(address) => address.hash(hasher),
            Write::Finish => {
                let _ = hasher.finish();
            }
        }
    }
}

/// One write of each kind, of values with every byte set (sign bits, top bytes) or in
/// patterns that show byte order.
pub(crate) fn one_of_each(seed: u64) -> Vec<Write> {
    let wide = (u128::from(seed) << 64) | u128::from(!seed.rotate_left(7));
    vec![
        Write::U8(seed as u8),
        Write::U16(seed as u16),
        Write::U32(seed as u32),
        Write::U64(seed),
        Write::U128(wide),
        Write::Usize(seed as usize),
        Write::I8(seed as i8),
        Write::I16(seed as i16),
        Write::I32(seed as i32),
        Write::I64(seed as i64),
        Write::I128(wide as i128),
        Write::Isize(seed as isize),
        Write::Str(String::new()),
        Write::Str("ab\u{7f}é".into()),
    ]
}

/// `writes` into `hasher`, and its hash.
pub(crate) fn hash(mut hasher: impl Hasher, writes: &[Write]) -> u64 {
    for write in writes {
        write.apply(&mut hasher);
    }
    hasher.finish()
}

/// Any one call: slices of up to `max_slice` bytes, strings of up to 40 characters, addresses.
pub(crate) fn any_write(max_slice: usize) -> impl Strategy<Value = Write> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..max_slice).prop_map(Write::Bytes),
        any::<u8>().prop_map(Write::U8),
        any::<u16>().prop_map(Write::U16),
        any::<u32>().prop_map(Write::U32),
        any::<u64>().prop_map(Write::U64),
        any::<u128>().prop_map(Write::U128),
        any::<usize>().prop_map(Write::Usize),
        any::<i8>().prop_map(Write::I8),
        any::<i16>().prop_map(Write::I16),
        any::<i32>().prop_map(Write::I32),
        any::<i64>().prop_map(Write::I64),
        any::<i128>().prop_map(Write::I128),
        any::<isize>().prop_map(Write::Isize),
        ".{0,40}".prop_map(Write::Str),
        any::<[u8; 4]>().prop_map(|octets| Write::Ip(IpAddr::V4(Ipv4Addr::from(octets)))),
        any::<[u8; 16]>().prop_map(|octets| Write::Ip(IpAddr::V6(Ipv6Addr::from(octets)))),
        Just(Write::Finish),
    ]
}
