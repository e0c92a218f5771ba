//! Serde for values that have a text form on the command line (CPU lists such as `0-3,8`,
//! policies such as `powersaving:2`): the JSON carries that same text, so what a person reads
//! in a stats line is what they would type.
//!
//! Writing goes through `collect_str`, which `serde_json` streams without building a
//! `String`, so a writer that reuses its buffer stays allocation-free.

use std::fmt::Display;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// Writes `value`'s text.
pub fn serialize<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// Reads a value back from its text.
pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
where
    T: FromStr,
    T::Err: Display,
    D: Deserializer<'de>,
{
    let text = String::deserialize(d)?;
    text.parse()
        .map_err(|e| D::Error::custom(format!("{text:?}: {e}")))
}

/// The same for an optional value, written as `null` when absent.
pub mod option {
    use super::*;

    /// Writes `value`'s text, or `null`.
    pub fn serialize<T: Display, S: Serializer>(
        value: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    /// Reads an optional value back from its text.
    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        match Option::<String>::deserialize(d)? {
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|e| D::Error::custom(format!("{text:?}: {e}"))),
            None => Ok(None),
        }
    }
}
