//! The canonical form of any `Serialize` value, written as it is serialised.
//!
//! [`super::canonical`] takes a `serde_json::Value`, so a typed value (an audit record) had to
//! be turned into one first: a map per object, every key hashed into it and copied, every
//! string cloned, then the whole tree dropped again. For the record appended with every
//! governed call that was more work than writing its canonical text. This serializer writes
//! the text directly. An object's members are written as they come, each remembered by its
//! key and its place in the output; when the object ends, its members are put in RFC 8785's
//! order (by UTF-16 code units) in place. Everything else is written as `serde_json::to_value`
//! followed by [`super::canonical`] would write it — the property tests hold the two to the
//! same bytes, since every stored chain hash depends on them: `None` and non-finite floats
//! are `null`, bytes are an array of numbers, an enum variant with data is a one-member
//! object, and of two members with the same key the later one is kept where the first was.

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};
use serde_json::Value;

use super::{EXACT, key_order, write_canonical, write_str};

/// The RFC 8785 canonical form of `value`, the same bytes as
/// `canonical(&serde_json::to_value(value)?)`.
pub fn canonical_of<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    let mut out = String::with_capacity(1024);
    value.serialize(&mut Writer { out: &mut out })?;
    Ok(out)
}

/// Why a value has no canonical form (a map key that is not a string, a number or a bool; an
/// integer outside what JSON numbers here hold; or the value's own `Serialize` failing).
#[derive(Debug)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// serde_json's name for a `RawValue` (its text is parsed and canonicalised like any value).
const RAW_VALUE: &str = "$serde_json::private::RawValue";

struct Writer<'a> {
    out: &'a mut String,
}

impl Writer<'_> {
    fn int(&mut self, i: i128) -> Result<(), Error> {
        use std::fmt::Write as _;
        if i.unsigned_abs() <= u128::from(EXACT) {
            let _ = write!(self.out, "{i}");
            return Ok(());
        }
        let n = if let Ok(i) = i64::try_from(i) {
            Value::from(i)
        } else if let Ok(u) = u64::try_from(i) {
            Value::from(u)
        } else {
            return Err(Error(format!("{i} is out of range for a JSON number")));
        };
        write_canonical(&n, self.out);
        Ok(())
    }

    fn float(&mut self, f: f64) {
        match serde_json::Number::from_f64(f) {
            Some(n) => write_canonical(&Value::Number(n), self.out),
            None => self.out.push_str("null"),
        }
    }

    /// `{"variant":` — the start of an enum variant that carries data.
    fn open_variant(&mut self, variant: &str) {
        self.out.push('{');
        write_str(variant, self.out);
        self.out.push(':');
    }
}

/// Integers that fit an `i128` are written by [`Writer::int`].
macro_rules! integers {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, v: $ty) -> Result<(), Error> {
            self.int(v.into())
        })*
    };
}

impl<'a, 'b> ser::Serializer for &'a mut Writer<'b> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a, 'b>;
    type SerializeTuple = Seq<'a, 'b>;
    type SerializeTupleStruct = Seq<'a, 'b>;
    type SerializeTupleVariant = Seq<'a, 'b>;
    type SerializeMap = Object<'a, 'b>;
    type SerializeStruct = Object<'a, 'b>;
    type SerializeStructVariant = Object<'a, 'b>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    integers!(
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
    );
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        let i = i128::try_from(v).map_err(|_| Error(format!("{v} is out of range")))?;
        self.int(i)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.float(v.into());
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.float(v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        write_str(v.encode_utf8(&mut [0; 4]), self.out);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(v, self.out);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        use ser::SerializeSeq as _;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for b in v {
            seq.serialize_element(b)?;
        }
        seq.end()
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, v: &'static str) -> Result<(), Error> {
        self.serialize_str(v)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.open_variant(variant);
        value.serialize(&mut *self)?;
        self.out.push('}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Seq<'a, 'b>, Error> {
        self.out.push('[');
        Ok(Seq {
            w: self,
            first: true,
            variant: false,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a, 'b>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Seq<'a, 'b>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Seq<'a, 'b>, Error> {
        self.open_variant(variant);
        self.out.push('[');
        Ok(Seq {
            w: self,
            first: true,
            variant: true,
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Object<'a, 'b>, Error> {
        Ok(Object::open(self, false, false))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Object<'a, 'b>, Error> {
        Ok(Object::open(self, false, name == RAW_VALUE))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Object<'a, 'b>, Error> {
        self.open_variant(variant);
        Ok(Object::open(self, true, false))
    }
}

/// An array being written.
struct Seq<'a, 'b> {
    w: &'a mut Writer<'b>,
    first: bool,
    /// Inside a one-member object naming an enum variant, closed after the array.
    variant: bool,
}

impl Seq<'_, '_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !std::mem::take(&mut self.first) {
            self.w.out.push(',');
        }
        value.serialize(&mut *self.w)
    }

    fn close(self) -> Result<(), Error> {
        self.w.out.push(']');
        if self.variant {
            self.w.out.push('}');
        }
        Ok(())
    }
}

/// The four kinds of sequence serde has are all written as an array.
macro_rules! array {
    ($($kind:ident::$add:ident),*) => {
        $(impl ser::$kind for Seq<'_, '_> {
            type Ok = ();
            type Error = Error;
            fn $add<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        })*
    };
}

array!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// One member of an object being written: its key and where `"key":value` lies in the output
/// (after the comma that separates it from the one before).
struct Member {
    key: Cow<'static, str>,
    start: usize,
    end: usize,
}

/// An object being written: its members go to the output as they come, and are put in order
/// when it closes if they did not come in it.
struct Object<'a, 'b> {
    w: &'a mut Writer<'b>,
    /// Where the object's members start in the output (after its `{`).
    start: usize,
    members: Vec<Member>,
    /// The key given by `serialize_key`, waiting for its value.
    key: Option<String>,
    /// Inside a one-member object naming an enum variant, closed after this one.
    variant: bool,
    /// serde_json's `RawValue`: its one member is JSON text, canonicalised in its place.
    raw: bool,
}

impl<'a, 'b> Object<'a, 'b> {
    fn open(w: &'a mut Writer<'b>, variant: bool, raw: bool) -> Self {
        if !raw {
            w.out.push('{');
        }
        let start = w.out.len();
        Object {
            w,
            start,
            members: Vec::new(),
            key: None,
            variant,
            raw,
        }
    }

    fn member<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), Error> {
        if self.raw {
            // Its one member is the JSON text, as a string.
            let literal = canonical_of(value)?;
            let text: String = serde_json::from_str(&literal).map_err(ser::Error::custom)?;
            let parsed: Value = serde_json::from_str(&text).map_err(ser::Error::custom)?;
            write_canonical(&parsed, self.w.out);
            return Ok(());
        }
        if !self.members.is_empty() {
            self.w.out.push(',');
        }
        let start = self.w.out.len();
        write_str(&key, self.w.out);
        self.w.out.push(':');
        value.serialize(&mut *self.w)?;
        let end = self.w.out.len();
        self.members.push(Member { key, start, end });
        Ok(())
    }

    /// Puts the members in canonical order, if they did not come in it, and closes the object.
    fn close(mut self) -> Result<(), Error> {
        if self.raw {
            return Ok(());
        }
        let members = &mut self.members;
        if !members
            .windows(2)
            .all(|m| key_order(&m[0].key, &m[1].key).is_lt())
        {
            // A stable sort keeps members with one key in the order they came; of those, the
            // value kept is the last one's (as a map keeps it).
            members.sort_by(|a, b| key_order(&a.key, &b.key));
            let (written, base) = (self.w.out.split_off(self.start), self.start);
            for (i, m) in members.iter().enumerate() {
                if members.get(i + 1).is_some_and(|next| next.key == m.key) {
                    continue;
                }
                if self.w.out.len() > base {
                    self.w.out.push(',');
                }
                self.w.out.push_str(&written[m.start - base..m.end - base]);
            }
        }
        self.w.out.push('}');
        if self.variant {
            self.w.out.push('}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(key.serialize(KeyText)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error("a map value came without its key".into()))?;
        self.member(Cow::Owned(key), value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// A struct and a struct variant's fields are an object's members.
macro_rules! object {
    ($($kind:ident),*) => {
        $(impl ser::$kind for Object<'_, '_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.member(Cow::Borrowed(key), value)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        })*
    };
}

object!(SerializeStruct, SerializeStructVariant);

/// A map key as the string serde_json makes of it: a string or char as it is, an integer or a
/// bool spelled out.
struct KeyText;

macro_rules! only_strings {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<String, Error> {
            not_a_key()
        })*
    };
}

macro_rules! spelled_out {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, v: $ty) -> Result<String, Error> {
            Ok(v.to_string())
        })*
    };
}

impl ser::Serializer for KeyText {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = Impossible<String, Error>;
    type SerializeTuple = Impossible<String, Error>;
    type SerializeTupleStruct = Impossible<String, Error>;
    type SerializeTupleVariant = Impossible<String, Error>;
    type SerializeMap = Impossible<String, Error>;
    type SerializeStruct = Impossible<String, Error>;
    type SerializeStructVariant = Impossible<String, Error>;

    spelled_out!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
    );
    only_strings!(
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
    );

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
    ) -> Result<String, Error> {
        Ok(v.to_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<String, Error> {
        not_a_key()
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<String, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, Error> {
        not_a_key()
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        not_a_key()
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        not_a_key()
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        not_a_key()
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        not_a_key()
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        not_a_key()
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        not_a_key()
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        not_a_key()
    }
}

fn not_a_key<T>() -> Result<T, Error> {
    Err(Error(
        "a map key must be a string, a number or a bool".into(),
    ))
}
