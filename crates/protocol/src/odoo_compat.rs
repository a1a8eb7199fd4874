//! What the agent accepts from a module written the ordinary Odoo way, and how it says
//! exactly what is wrong with an answer it cannot read (docs/connectivity/protocol.md,
//! "What the agent accepts from Odoo").
//!
//! Odoo 19 serialises a method's result with `odoo.tools.json.json_default`: a `datetime`
//! becomes `"YYYY-MM-DD HH:MM:SS"` (UTC, no offset, no `T`), and the ORM reads an empty
//! Char, Text, Selection, Date or Datetime field as `False` (an empty Integer as `0`, which
//! is a value). So a module that returns `fields.Datetime.now()` or `record.some_field` as
//! it stands sends those forms. The rules, written once here and used on every such field
//! of what the agent reads:
//!
//! * a timestamp is RFC 3339 with an offset (preferred), or `YYYY-MM-DD HH:MM:SS` /
//!   `YYYY-MM-DDTHH:MM:SS`, optionally with 1 to 9 digits of fractional seconds, read as
//!   UTC ([`timestamp`], [`option_timestamp`], [`parse_timestamp`]);
//! * `false` (and `null`) in an optional field that is not a boolean is "not set"
//!   ([`option`], [`or_default`]); in a boolean with a default, `null` is that default.
//!
//! The `spec` objects are Kubernetes specs whose types live in the `api` crate, so no
//! attribute can be put on their fields. [`decode`] applies the same two rules there, led
//! by the types themselves: when a member of a spec fails to deserialise because it is
//! `false` or an offset-less timestamp, that member (at the same place in every entry) is
//! dropped or read as UTC, and the answer is read again. Only values that would have been
//! refused are changed, so a valid answer reads exactly as before.
//!
//! Serialisation is untouched: the agent always writes RFC 3339 with `Z`.

use std::{fmt, marker::PhantomData};

use jiff::{Timestamp, civil::DateTime, tz::Offset};
use serde::{
    Deserialize, Deserializer,
    de::{
        self, DeserializeOwned, Unexpected, Visitor,
        value::{
            BoolDeserializer, BorrowedBytesDeserializer, BorrowedStrDeserializer, BytesDeserializer,
            EnumAccessDeserializer, F64Deserializer, I64Deserializer, MapAccessDeserializer, SeqAccessDeserializer,
            StrDeserializer, StringDeserializer, U64Deserializer,
        },
    },
};
use serde_json::Value;

/// What a timestamp field expects, as the error messages say it.
pub const TIMESTAMP_EXPECTED: &str = "a timestamp: RFC 3339 with an offset (2026-12-01T19:30:45Z), or Odoo's \
     UTC form without one (2026-12-01 19:30:45, optionally with fractional seconds)";

/// Most characters of a received string quoted in an error.
pub const MAX_QUOTED_CHARS: usize = 64;

/// Most characters of an "expected" text taken from a deserialiser's message.
const MAX_EXPECTED_CHARS: usize = 240;

/// Most members of specs [`decode`] repairs in one answer (one repair covers that member
/// in every entry, so this bounds the re-reads, not the entries).
pub const MAX_REPAIRS: usize = 32;

/// A timestamp that is neither RFC 3339 with an offset nor Odoo's offset-less UTC form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected {TIMESTAMP_EXPECTED}")]
pub struct TimestampError;

/// Parses a timestamp as the agent accepts it from Odoo: RFC 3339 with an offset, or
/// `YYYY-MM-DD[ T]HH:MM:SS[.fraction]` without one, read as UTC.
pub fn parse_timestamp(s: &str) -> Result<Timestamp, TimestampError> {
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    let civil = offsetless(s).ok_or(TimestampError)?;
    let dt: DateTime = civil.parse().map_err(|_| TimestampError)?;
    Offset::UTC.to_timestamp(dt).map_err(|_| TimestampError)
}

/// `s` with a `T` separator when it has Odoo's offset-less shape
/// (`YYYY-MM-DD[ Tt]HH:MM:SS[.d{1,9}]`), else `None`. The shape is checked by hand so that
/// nothing else jiff would read as a civil time (a date alone, an annotation) passes.
fn offsetless(s: &str) -> Option<String> {
    const SHAPE: &[u8; 19] = b"dddd-dd-dd_dd:dd:dd";
    let bytes = s.as_bytes();
    let (head, fraction) = bytes.split_at_checked(SHAPE.len())?;
    let shape_ok = head.iter().zip(SHAPE).all(|(b, want)| match want {
        b'd' => b.is_ascii_digit(),
        b'_' => matches!(b, b' ' | b'T' | b't'),
        other => b == other,
    });
    let fraction_ok = match fraction.split_first() {
        None => true,
        Some((b'.', digits)) => (1..=9).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    if !(shape_ok && fraction_ok) {
        return None;
    }
    // Only ASCII was accepted above, so byte 10 is a character boundary.
    let (date, rest) = s.split_at_checked(10)?;
    Some(format!("{date}T{}", rest.get(1..)?))
}

/// The RFC 3339 form (with `Z`) of an offset-less timestamp, as [`decode`] rewrites it in
/// a spec; `None` when `s` is not one.
fn rfc3339_of_offsetless(s: &str) -> Option<String> {
    offsetless(s).map(|t| format!("{t}Z"))
}

struct TimestampVisitor;

impl<'de> Visitor<'de> for TimestampVisitor {
    type Value = Option<Timestamp>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(TIMESTAMP_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        parse_timestamp(v)
            .map(Some)
            .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        if v {
            Err(E::invalid_type(Unexpected::Bool(v), &self))
        } else {
            Ok(None)
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// `deserialize_with` for a required timestamp ([`parse_timestamp`]).
pub fn timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
    d.deserialize_any(TimestampVisitor)?
        .ok_or_else(|| de::Error::invalid_type(Unexpected::Bool(false), &TIMESTAMP_EXPECTED))
}

/// `deserialize_with` for an optional timestamp: `false`, `null` or absent (with
/// `#[serde(default)]`) is `None`.
pub fn option_timestamp<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
    d.deserialize_any(TimestampVisitor)
}

/// Reads `false`, `null` and "none" as `None` and hands anything else to `T` unchanged.
/// It forwards through serde's own value deserialisers rather than buffering a
/// `serde_json::Value`, so nothing is copied and the path of an error inside `T` (which
/// [`decode`] reports) is kept.
struct FalseAsNone<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for FalseAsNone<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value, or false or null for none")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        if v {
            T::deserialize(BoolDeserializer::<E>::new(v)).map(Some)
        } else {
            Ok(None)
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        T::deserialize(I64Deserializer::<E>::new(v)).map(Some)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        T::deserialize(U64Deserializer::<E>::new(v)).map(Some)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        T::deserialize(F64Deserializer::<E>::new(v)).map(Some)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        T::deserialize(StrDeserializer::<E>::new(v)).map(Some)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        T::deserialize(BorrowedStrDeserializer::<E>::new(v)).map(Some)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        T::deserialize(StringDeserializer::<E>::new(v)).map(Some)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        T::deserialize(BytesDeserializer::<E>::new(v)).map(Some)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        T::deserialize(BorrowedBytesDeserializer::<E>::new(v)).map(Some)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        T::deserialize(d).map(Some)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::deserialize(SeqAccessDeserializer::new(seq)).map(Some)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Some)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        T::deserialize(EnumAccessDeserializer::new(data)).map(Some)
    }
}

/// `deserialize_with` for an optional field that is not a boolean: `false`, `null` or
/// absent (with `#[serde(default)]`) is `None`; anything else is read as `T`.
pub fn option<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    d.deserialize_any(FalseAsNone(PhantomData))
}

/// `deserialize_with` for a field with a default (a list, a string, a boolean): `false`
/// and `null` are the default. For a boolean `false` is its default anyway, so this only
/// adds `null`.
pub fn or_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    option(d).map(Option::unwrap_or_default)
}

/// An answer that does not follow the protocol, located: where, what came, what was
/// expected. `Display` is the sentence the agent's errors carry after the method's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: received {received}; expected {expected}", if path.is_empty() { "the answer".to_owned() } else { format!("`{path}`") })]
pub struct AnswerError {
    /// JSON path of the member, e.g. `desired.operations[0].spec.deadline`; empty for the
    /// answer itself.
    pub path: String,
    /// What was there, bounded ([`describe`]); never a value whose member's name suggests
    /// a secret.
    pub received: String,
    /// What the protocol expects there.
    pub expected: String,
}

impl AnswerError {
    /// An error at `path` (segments, `[i]` for an index) of `answer`, with what it holds.
    pub fn at(answer: &Value, path: &[PathSegment], expected: impl Into<String>) -> Self {
        Self {
            path: render(path),
            received: describe(lookup(answer, path), last_key(path)),
            expected: expected.into(),
        }
    }

    /// Whether the error lies at or inside the answer's member `member` (say `desired`, the
    /// document, as opposed to the answer's own fields).
    pub fn in_member(&self, member: &str) -> bool {
        self.path == member
            || self
                .path
                .strip_prefix(member)
                .is_some_and(|rest| rest.starts_with(['.', '[']))
    }
}

/// One step of a JSON path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    /// A member of an object.
    Key(String),
    /// An element of an array.
    Index(usize),
}

impl From<&str> for PathSegment {
    fn from(key: &str) -> Self {
        Self::Key(key.to_owned())
    }
}

fn render(path: &[PathSegment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            PathSegment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            PathSegment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn last_key(path: &[PathSegment]) -> &str {
    path.iter()
        .rev()
        .find_map(|s| match s {
            PathSegment::Key(k) => Some(k.as_str()),
            PathSegment::Index(_) => None,
        })
        .unwrap_or_default()
}

fn lookup<'v>(value: &'v Value, path: &[PathSegment]) -> Option<&'v Value> {
    path.iter().try_fold(value, |v, segment| match segment {
        PathSegment::Key(key) => v.get(key.as_str()),
        PathSegment::Index(i) => v.get(*i),
    })
}

fn lookup_mut<'v>(value: &'v mut Value, path: &[PathSegment]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |v, segment| match segment {
        PathSegment::Key(key) => v.get_mut(key.as_str()),
        PathSegment::Index(i) => v.get_mut(*i),
    })
}

/// Whether a member's name suggests it holds a credential: its value is never quoted.
fn sensitive(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "credential",
        "private",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// A bounded description of a received value, for error messages: scalars as JSON (a
/// string cut after [`MAX_QUOTED_CHARS`] characters), containers by their size, and the
/// content of a string whose member `key` looks like a credential never.
pub fn describe(value: Option<&Value>, key: &str) -> String {
    match value {
        None => "nothing (the member is absent)".to_owned(),
        Some(Value::Null) => "null".to_owned(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => {
            let chars = s.chars().count();
            if sensitive(key) {
                format!("a string of {chars} characters (not shown: `{key}` may hold a secret)")
            } else if chars > MAX_QUOTED_CHARS {
                let head: String = s.chars().take(MAX_QUOTED_CHARS).collect();
                format!("{head:?}… (a string of {chars} characters)")
            } else {
                format!("{s:?}")
            }
        }
        Some(Value::Array(a)) => format!("an array of {} items", a.len()),
        Some(Value::Object(o)) => format!("an object with {} members", o.len()),
    }
}

/// A deserialisation error with its path, before it is located in the answer.
#[derive(Clone, Debug)]
struct RawError {
    path: Vec<PathSegment>,
    message: String,
}

impl RawError {
    fn missing_field(&self) -> Option<&str> {
        self.message.strip_prefix("missing field `")?.split('`').next()
    }

    /// Located in `answer` (the answer as received, before any repair).
    fn locate(&self, answer: &Value) -> AnswerError {
        if let Some(field) = self.missing_field() {
            let mut path = self.path.clone();
            path.push(PathSegment::Key(field.to_owned()));
            return AnswerError::at(answer, &path, "a value: this member is required");
        }
        AnswerError::at(answer, &self.path, expected_of(&self.message))
    }
}

/// The "expected …" part of a deserialiser's message (`invalid type: string "x", expected
/// u32` gives `u32`); the message itself, bounded, when it has none. The received value is
/// not taken from the message: it is read from the answer and bounded ([`describe`]).
fn expected_of(message: &str) -> String {
    let tail = [", expected ", ": expected "]
        .iter()
        .filter_map(|marker| message.rfind(marker).map(|at| at + marker.len()))
        .max()
        .and_then(|at| message.get(at..))
        .or_else(|| message.strip_prefix("expected "));
    let bound = |text: &str| {
        let bounded: String = text.chars().take(MAX_EXPECTED_CHARS).collect();
        if bounded.len() < text.len() {
            format!("{bounded}…")
        } else {
            bounded
        }
    };
    match tail {
        Some(tail) => bound(tail),
        // A timestamp of a spec (a Kubernetes `Time`) says what jiff could not find.
        None if message.contains("timestamp") => format!("{TIMESTAMP_EXPECTED} ({})", bound(message)),
        None => bound(message),
    }
}

fn attempt<T: DeserializeOwned>(value: &Value) -> Result<T, RawError> {
    serde_path_to_error::deserialize(value).map_err(|e| RawError {
        path: e
            .path()
            .iter()
            .filter_map(|segment| match segment {
                serde_path_to_error::Segment::Seq { index } => Some(PathSegment::Index(*index)),
                serde_path_to_error::Segment::Map { key } => Some(PathSegment::Key(key.clone())),
                // An enum variant is a map key or a string in JSON: the key is already in
                // the path, or the string is the value itself.
                serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => None,
            })
            .collect(),
        message: e.into_inner().to_string(),
    })
}

/// A member of a spec, in every entry: the path with each index a wildcard.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Key(String),
    AnyIndex,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fix {
    /// `false` where the type takes no boolean: the member is dropped.
    DropFalse,
    /// An offset-less timestamp: rewritten as RFC 3339 UTC.
    Utc,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Repair {
    pattern: Vec<Step>,
    fix: Fix,
}

impl Repair {
    /// The repair for `error`, when it is one of the two Odoo forms inside a `spec`.
    fn of(current: &Value, error: &RawError) -> Option<Self> {
        if error.missing_field().is_some() || !error.path.contains(&PathSegment::Key("spec".into())) {
            return None;
        }
        let fix = match lookup(current, &error.path)? {
            // A dropped member must be a member, not an array element.
            Value::Bool(false) if matches!(error.path.last(), Some(PathSegment::Key(_))) => Fix::DropFalse,
            Value::String(s) if offsetless(s).is_some() => Fix::Utc,
            _ => return None,
        };
        let pattern = error
            .path
            .iter()
            .map(|s| match s {
                PathSegment::Key(k) => Step::Key(k.clone()),
                PathSegment::Index(_) => Step::AnyIndex,
            })
            .collect();
        Some(Self { pattern, fix })
    }

    fn apply(&self, value: &mut Value) {
        fn walk(value: &mut Value, pattern: &[Step], fix: Fix) {
            match pattern {
                [] => {}
                [Step::Key(key)] if fix == Fix::DropFalse => {
                    if let Some(object) = value.as_object_mut()
                        && object.get(key) == Some(&Value::Bool(false))
                    {
                        object.remove(key);
                    }
                }
                [last] if fix == Fix::Utc => {
                    let leaves: Vec<&mut Value> = match last {
                        Step::Key(key) => value.get_mut(key.as_str()).into_iter().collect(),
                        Step::AnyIndex => value.as_array_mut().map(|a| a.iter_mut().collect()).unwrap_or_default(),
                    };
                    for leaf in leaves {
                        if let Some(fixed) = leaf.as_str().and_then(rfc3339_of_offsetless) {
                            *leaf = Value::String(fixed);
                        }
                    }
                }
                [Step::Key(key), rest @ ..] => {
                    if let Some(child) = value.get_mut(key.as_str()) {
                        walk(child, rest, fix);
                    }
                }
                [Step::AnyIndex, rest @ ..] => {
                    for child in value.as_array_mut().into_iter().flatten() {
                        walk(child, rest, fix);
                    }
                }
            }
        }
        walk(value, &self.pattern, self.fix);
    }

    /// Whether dropping the member made `next` say it is missing: it is required, so the
    /// `false` was the error after all.
    fn made_missing(&self, next: &RawError) -> bool {
        let (Fix::DropFalse, Some((Step::Key(key), parent))) = (self.fix, self.pattern.split_last()) else {
            return false;
        };
        next.missing_field() == Some(key.as_str())
            && next.path.len() == parent.len()
            && next.path.iter().zip(parent).all(|(s, p)| match (s, p) {
                (PathSegment::Key(a), Step::Key(b)) => a == b,
                (PathSegment::Index(_), Step::AnyIndex) => true,
                _ => false,
            })
    }
}

/// Members of a spec typed as free JSON, which must hold an object when set: their type
/// accepts `false`, so the rule is applied by name (`spec.values`,
/// `spec.restoreVerification.job`).
const FREE_JSON_OBJECTS: &[&[&str]] = &[&["values"], &["restoreVerification", "job"]];

/// Where the applications are: a pushed document's own list, or the one of `agent_sync`'s
/// `desired`.
const APPLICATION_LISTS: [&str; 2] = ["/applications", "/desired/applications"];

/// A copy of `answer` with `false` removed from the free-JSON members of every
/// application's spec, when there is one to remove (no copy otherwise).
fn without_false_free_json(answer: &Value) -> Option<Value> {
    let members = |app: &Value| -> Vec<(Vec<PathSegment>, String)> {
        FREE_JSON_OBJECTS
            .iter()
            .filter_map(|path| {
                let (member, parent) = path.split_last()?;
                let parent: Vec<PathSegment> = std::iter::once("spec")
                    .chain(parent.iter().copied())
                    .map(Into::into)
                    .collect();
                let object = lookup(app, &parent)?.as_object()?;
                (object.get(*member) == Some(&Value::Bool(false))).then(|| (parent, (*member).to_owned()))
            })
            .collect()
    };
    let found = APPLICATION_LISTS
        .iter()
        .filter_map(|p| answer.pointer(p)?.as_array())
        .flatten()
        .any(|app| !members(app).is_empty());
    if !found {
        return None;
    }
    let mut fixed = answer.clone();
    for pointer in APPLICATION_LISTS {
        for app in fixed
            .pointer_mut(pointer)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            for (parent, member) in members(app) {
                if let Some(object) = lookup_mut(app, &parent).and_then(Value::as_object_mut) {
                    object.remove(&member);
                }
            }
        }
    }
    Some(fixed)
}

/// Reads an answer (or a pushed document) the way the agent accepts it from Odoo: the
/// field rules of this module, the same rules inside `spec` objects (see the module
/// documentation), and, when it still does not read, an [`AnswerError`] naming the JSON
/// path, what was received (bounded, from the answer as received) and what is expected.
pub fn decode<T: DeserializeOwned>(answer: &Value) -> Result<T, AnswerError> {
    let mut repaired = without_false_free_json(answer);
    let mut error = match attempt::<T>(repaired.as_ref().unwrap_or(answer)) {
        Ok(t) => return Ok(t),
        Err(e) => e,
    };
    let mut tried: Vec<Repair> = Vec::new();
    while tried.len() < MAX_REPAIRS {
        let Some(repair) = Repair::of(repaired.as_ref().unwrap_or(answer), &error) else {
            break;
        };
        if tried.contains(&repair) {
            break;
        }
        let value = repaired.get_or_insert_with(|| answer.clone());
        repair.apply(value);
        match attempt::<T>(value) {
            Ok(t) => return Ok(t),
            Err(next) if repair.made_missing(&next) => break,
            Err(next) => {
                tried.push(repair);
                error = next;
            }
        }
    }
    Err(error.locate(answer))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;
    use crate::messages::{DesiredState, RegisterResult, SyncResult};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn timestamps_with_an_offset_or_in_odoo_utc_form() {
        let cases = [
            ("2026-12-01T19:30:45Z", Some("2026-12-01T19:30:45Z")),
            ("2026-12-01T20:30:45+01:00", Some("2026-12-01T19:30:45Z")),
            ("2026-12-01 19:30:45", Some("2026-12-01T19:30:45Z")),
            ("2026-12-01T19:30:45", Some("2026-12-01T19:30:45Z")),
            ("2026-12-01 19:30:45.5", Some("2026-12-01T19:30:45.5Z")),
            ("2026-12-01 19:30:45.123456", Some("2026-12-01T19:30:45.123456Z")),
            ("2026-12-01 19:30:45.123456789", Some("2026-12-01T19:30:45.123456789Z")),
            ("2026-12-01 19:30:45.1234567890", None),
            ("2026-12-01 19:30:45.", None),
            ("2026-12-01", None),
            ("2026-12-01 19:30", None),
            ("2026-13-01 19:30:45", None),
            ("2026-02-30 19:30:45", None),
            ("2026-12-01 19:30:45 ", None),
            ("2026-12-01x19:30:45", None),
            ("2026-12-01 19:30:45[Europe/Brussels]", None),
            ("", None),
            ("é026-12-01 19:30:45", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_timestamp(input).ok(), want.map(ts), "{input:?}");
        }
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Fields {
        #[serde(deserialize_with = "timestamp")]
        at: Timestamp,
        #[serde(default, deserialize_with = "option_timestamp")]
        maybe_at: Option<Timestamp>,
        #[serde(default, deserialize_with = "option")]
        count: Option<u32>,
        #[serde(default, deserialize_with = "option")]
        text: Option<String>,
        #[serde(default, deserialize_with = "option")]
        nested: Option<Nested>,
        #[serde(default, deserialize_with = "or_default")]
        list: Vec<u8>,
        #[serde(default, deserialize_with = "or_default")]
        flag: bool,
        #[serde(default, deserialize_with = "option")]
        kind: Option<crate::messages::ObjectKind>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Nested {
        n: u8,
    }

    #[test]
    fn false_and_null_are_not_set_and_other_values_read_as_before() {
        let empty: Fields = serde_json::from_value(json!({"at": "2026-12-01 19:30:45", "maybe_at": false,
            "count": false, "text": false, "nested": false, "list": false, "flag": null, "kind": false}))
        .unwrap();
        assert_eq!(
            empty,
            Fields {
                at: ts("2026-12-01T19:30:45Z"),
                maybe_at: None,
                count: None,
                text: None,
                nested: None,
                list: vec![],
                flag: false,
                kind: None,
            }
        );
        let absent: Fields = serde_json::from_str(r#"{"at": "2026-12-01T19:30:45Z"}"#).unwrap();
        assert_eq!(absent, empty);
        let full = r#"{"at": "2026-12-01T19:30:45Z", "maybe_at": "2026-12-01 19:30:46", "count": 7,
            "text": "x", "nested": {"n": 1}, "list": [1, 2], "flag": true, "kind": "Operation"}"#;
        // From text (borrowed strings) and from a Value (owned ones).
        for got in [
            serde_json::from_str::<Fields>(full).unwrap(),
            serde_json::from_value::<Fields>(serde_json::from_str(full).unwrap()).unwrap(),
        ] {
            assert_eq!(got.maybe_at, Some(ts("2026-12-01T19:30:46Z")));
            assert_eq!((got.count, got.text.as_deref()), (Some(7), Some("x")));
            assert_eq!(
                (got.nested, got.list, got.flag),
                (Some(Nested { n: 1 }), vec![1, 2], true)
            );
            assert_eq!(got.kind, Some(crate::messages::ObjectKind::Operation));
        }
        for (bad, path) in [
            (json!({"at": false}), "at"),
            (json!({"at": "2026-12-01"}), "at"),
            (json!({"at": "2026-12-01T19:30:45Z", "count": true}), "count"),
            (json!({"at": "2026-12-01T19:30:45Z", "count": -1}), "count"),
            (
                json!({"at": "2026-12-01T19:30:45Z", "nested": {"n": "one"}}),
                "nested.n",
            ),
            (json!({"at": "2026-12-01T19:30:45Z", "list": [1, "two"]}), "list[1]"),
        ] {
            let err = decode::<Fields>(&bad).unwrap_err();
            assert_eq!(err.path, path, "{bad}: {err}");
        }
    }

    #[test]
    fn a_register_answer_of_an_ordinary_odoo_method_reads() {
        // `fields.Datetime.now()` and empty Integer fields, as json_default sends them.
        let answer = json!({"protocol_version": "1.5", "cluster_id": 3, "server_time": "2026-12-01 19:30:45",
            "sync_interval_seconds": false, "max_reports_per_sync": false});
        let r: RegisterResult = decode(&answer).unwrap();
        assert_eq!(r.server_time, ts("2026-12-01T19:30:45Z"));
        assert_eq!((r.sync_interval_seconds, r.max_reports_per_sync), (None, None));
        // Written back as before: RFC 3339 with Z, optional fields left out.
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"protocol_version": "1.5", "cluster_id": 3, "server_time": "2026-12-01T19:30:45Z"})
        );
    }

    fn operation(not_before: Value, deadline: Value) -> Value {
        json!({"namespace": "team-a", "name": "wiki-backup", "spec": {"type": "Backup",
            "applicationRef": {"name": "wiki"}, "requestId": "odoo-op-1",
            "notBefore": not_before, "deadline": deadline}})
    }

    fn application(version: Value, values: Value) -> Value {
        json!({"namespace": "team-a", "name": "wiki", "spec": {"chart": {"name": "wiki", "version": version,
            "repository": {"url": "https://charts.example.com"}}, "values": values,
            "test": {"enable": false}}})
    }

    #[test]
    fn a_sync_answer_with_odoo_forms_in_the_document_and_its_specs_reads() {
        let answer = json!({"protocol_version": "1.5", "server_time": "2026-12-01 19:30:45",
            "next_sync_seconds": false, "max_reports_per_sync": false, "resync_requested": false,
            "desired": {"epoch": "e1", "revision": 4, "generated_at": "2026-12-01 19:30:44.250",
                "applications": [application(json!(false), json!(false)), application(json!("1.2.3"), json!({"a": false}))],
                "operations": [operation(json!(false), json!("2026-12-02 03:00:00")),
                               operation(json!("2026-12-01 22:00:00"), json!(false))],
                "deletions": [{"kind": "Operation", "namespace": "team-a", "name": "old", "uid": false, "reason": false}]}});
        let r: SyncResult = decode(&answer).unwrap();
        let doc = r.desired.unwrap();
        assert_eq!(doc.generated_at, Some(ts("2026-12-01T19:30:44.25Z")));
        let [first, second] = &doc.applications[..] else {
            panic!("two applications")
        };
        assert_eq!(
            (first.spec.chart.version.as_deref(), first.spec.values.as_ref()),
            (None, None)
        );
        assert_eq!(second.spec.chart.version.as_deref(), Some("1.2.3"));
        assert_eq!(
            second.spec.values,
            Some(json!({"a": false})),
            "false inside values is data"
        );
        assert_eq!(
            first.spec.test.as_ref().and_then(|t| t.enable),
            Some(false),
            "a boolean's false stays false"
        );
        let [a, b] = &doc.operations[..] else {
            panic!("two operations")
        };
        assert_eq!(a.spec.not_before, None);
        assert_eq!(a.spec.deadline.as_ref().map(|t| t.0), Some(ts("2026-12-02T03:00:00Z")));
        assert_eq!(
            b.spec.not_before.as_ref().map(|t| t.0),
            Some(ts("2026-12-01T22:00:00Z"))
        );
        assert_eq!(b.spec.deadline, None);
        assert_eq!(
            (doc.deletions[0].uid.as_ref(), doc.deletions[0].reason.as_ref()),
            (None, None)
        );

        // A pushed document (the document at the root) reads the same way.
        let pushed: DesiredState = decode(&answer["desired"]).unwrap();
        assert_eq!(pushed, doc);
        // `desired: false` is "up to date".
        let up_to_date: SyncResult = decode(&json!({"protocol_version": "1.5",
            "server_time": "2026-12-01T19:30:45Z", "desired": false}))
        .unwrap();
        assert_eq!(up_to_date.desired, None);
    }

    #[test]
    fn what_cannot_be_read_is_named_by_path_with_what_came_and_what_is_expected() {
        let base = || {
            json!({"protocol_version": "1.5", "server_time": "2026-12-01T19:30:45Z",
                "desired": {"epoch": "e1", "revision": 4, "applications": [application(json!("1.0"), json!({}))],
                    "operations": [operation(json!(false), json!(false))]}})
        };
        let mut cases: Vec<(Value, &str, &str, &str)> = Vec::new();
        let mut v = base();
        v["server_time"] = json!("01/12/2026 19:30");
        cases.push((v, "server_time", "\"01/12/2026 19:30\"", TIMESTAMP_EXPECTED));
        let mut v = base();
        v["server_time"] = json!(false);
        cases.push((v, "server_time", "false", TIMESTAMP_EXPECTED));
        let mut v = base();
        v.as_object_mut().unwrap().remove("server_time");
        cases.push((
            v,
            "server_time",
            "nothing (the member is absent)",
            "a value: this member is required",
        ));
        let mut v = base();
        v["desired"]["operations"][0]["spec"]["deadline"] = json!("2026-12-02");
        cases.push((v, "desired.operations[0].spec.deadline", "\"2026-12-02\"", ""));
        let mut v = base();
        v["desired"]["operations"][0]["spec"]["requestId"] = json!(false);
        cases.push((v, "desired.operations[0].spec.requestId", "false", "a string"));
        let mut v = base();
        v["desired"]["applications"][0]["spec"]["chart"]["name"] = json!("x".repeat(500));
        v["desired"]["applications"][0]["spec"]["chart"]["version"] = json!(7);
        cases.push((v, "desired.applications[0].spec.chart.version", "7", "a string"));
        let mut v = base();
        v["desired"]["revision"] = json!("four");
        cases.push((v, "desired.revision", "\"four\"", "u64"));
        let mut v = base();
        v["desired"]["deletions"] = json!([{"kind": "Pod", "namespace": "a", "name": "b"}]);
        cases.push((
            v,
            "desired.deletions[0].kind",
            "\"Pod\"",
            "`ApplicationInstance` or `Operation`",
        ));
        let mut v = base();
        v["desired"]["applications"][0]["spec"]["chart"]["repository"]["url"] = json!(["x", "y", "z"]);
        cases.push((
            v,
            "desired.applications[0].spec.chart.repository.url",
            "an array of 3 items",
            "a string",
        ));
        for (answer, path, received, expected) in cases {
            let err = decode::<SyncResult>(&answer).unwrap_err();
            assert_eq!((err.path.as_str(), err.received.as_str()), (path, received), "{err}");
            assert!(err.expected.contains(expected), "{err}");
        }

        // Bounded, and no value of a member named like a secret.
        let long = json!({"protocol_version": "1.5", "server_time": "y".repeat(10_000), "cluster_id": 1});
        let err = decode::<RegisterResult>(&long).unwrap_err();
        assert!(err.to_string().len() < 600, "{err}");
        assert!(err.received.ends_with("(a string of 10000 characters)"), "{err}");
        assert_eq!(
            describe(Some(&json!("hunter2")), "db_password"),
            "a string of 7 characters (not shown: `db_password` may hold a secret)"
        );
        assert_eq!(
            decode::<RegisterResult>(&json!("ok")).unwrap_err().to_string(),
            "the answer: received \"ok\"; expected struct RegisterResult"
        );
    }

    #[test]
    fn a_required_member_sent_as_false_is_named_not_dropped() {
        let answer = json!({"epoch": "e1", "revision": 1, "applications": [{"namespace": "a", "name": "b",
            "spec": {"chart": {"name": false}}}]});
        let err = decode::<DesiredState>(&answer).unwrap_err();
        assert_eq!(
            (err.path.as_str(), err.received.as_str()),
            ("applications[0].spec.chart.name", "false")
        );
        assert!(err.expected.contains("a string"), "{err}");
    }

    #[test]
    fn repairs_are_bounded_by_members_not_entries() {
        let operations: Vec<Value> = (0..2000)
            .map(|_| operation(json!(false), json!("2026-12-02 03:00:00")))
            .collect();
        let doc = json!({"epoch": "e1", "revision": 1, "operations": operations});
        let started = std::time::Instant::now();
        let parsed: DesiredState = decode(&doc).unwrap();
        assert_eq!(parsed.operations.len(), 2000);
        assert!(
            parsed
                .operations
                .iter()
                .all(|o| o.spec.not_before.is_none() && o.spec.deadline.is_some())
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn values_as_deep_as_the_parser_allows_decode_on_a_small_stack() {
        // serde_json parses at most 128 levels; the path tracking adds frames per level,
        // which must fit a worker thread's stack with room to spare.
        let mut values = json!(0);
        for _ in 0..120 {
            values = json!({ "": values });
        }
        let doc = json!({"epoch": "e1", "revision": 1, "applications": [application(json!(false), values)]});
        let text = doc.to_string();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        let decoded = std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(move || decode::<DesiredState>(&parsed).map(|d| d.applications.len()))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(decoded, Ok(1));
    }

    #[test]
    fn in_member_tells_the_document_from_the_answer() {
        let e = |path: &str| AnswerError {
            path: path.into(),
            received: String::new(),
            expected: String::new(),
        };
        assert!(e("desired").in_member("desired"));
        assert!(e("desired.operations[0]").in_member("desired"));
        assert!(!e("desired_x").in_member("desired"));
        assert!(!e("server_time").in_member("desired"));
    }
}
