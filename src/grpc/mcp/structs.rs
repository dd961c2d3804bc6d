//! `google.protobuf.Struct`, the transport's JSON, to and from
//! `serde_json`. A Struct's numbers are all doubles: one that is a whole
//! number within ±2^53 becomes a JSON integer (what a tool's `integer`
//! schema expects of the `10` a client wrote), any other a JSON float; a
//! NaN or infinity has no JSON form and is refused.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use serde_json::{Map, Number};

/// The largest magnitude a double holds every integer up to.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// A JSON object as a Struct.
pub(super) fn to_struct(object: Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: object
            .into_iter()
            .map(|(key, value)| (key, to_value(value)))
            .collect(),
    }
}

/// A JSON value as a Struct's value.
pub(super) fn to_value(value: serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        #[allow(clippy::cast_precision_loss)]
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(to_value).collect(),
        }),
        serde_json::Value::Object(object) => Kind::StructValue(to_struct(object)),
    };
    Value { kind: Some(kind) }
}

/// A Struct as a JSON object.
///
/// # Errors
/// The path of a number that is not finite (`$.a.b[2]`).
pub(super) fn to_object(value: Struct) -> Result<Map<String, serde_json::Value>, String> {
    object_at(value, "$")
}

fn object_at(value: Struct, path: &str) -> Result<Map<String, serde_json::Value>, String> {
    value
        .fields
        .into_iter()
        .map(|(key, value)| {
            let at = format!("{path}.{key}");
            Ok((key, json_at(value, &at)?))
        })
        .collect()
}

fn json_at(value: Value, path: &str) -> Result<serde_json::Value, String> {
    Ok(match value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(b),
        Some(Kind::NumberValue(n)) => number(n)
            .map(serde_json::Value::Number)
            .ok_or_else(|| format!("{path} is {n}, which JSON cannot carry"))?,
        Some(Kind::StringValue(s)) => serde_json::Value::String(s),
        Some(Kind::ListValue(list)) => serde_json::Value::Array(
            list.values
                .into_iter()
                .enumerate()
                .map(|(i, item)| json_at(item, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Some(Kind::StructValue(object)) => serde_json::Value::Object(object_at(object, path)?),
    })
}

/// A double as a JSON number: whole numbers within ±2^53 as integers.
fn number(n: f64) -> Option<Number> {
    if n.fract() == 0.0 && n.abs() <= EXACT_INTEGERS {
        #[allow(clippy::cast_possible_truncation)]
        return Some(Number::from(n as i64));
    }
    Number::from_f64(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_go_there_and_back() {
        let object = json!({
            "a": 10, "b": 1.5, "c": "x", "d": [true, null, {"e": -3}], "f": {}
        });
        let serde_json::Value::Object(map) = object.clone() else {
            unreachable!()
        };
        let back = to_object(to_struct(map)).unwrap();
        assert_eq!(serde_json::Value::Object(back), object);
    }

    #[test]
    fn numbers_json_cannot_carry_are_named_by_path() {
        let mut inner = Struct::default();
        inner.fields.insert(
            "n".into(),
            Value {
                kind: Some(Kind::NumberValue(f64::NAN)),
            },
        );
        let mut outer = Struct::default();
        outer.fields.insert(
            "a".into(),
            Value {
                kind: Some(Kind::ListValue(ListValue {
                    values: vec![Value {
                        kind: Some(Kind::StructValue(inner)),
                    }],
                })),
            },
        );
        let error = to_object(outer).unwrap_err();
        assert!(error.starts_with("$.a[0].n is NaN"), "{error}");
    }

    #[test]
    fn big_and_fractional_numbers_stay_floats() {
        assert_eq!(number(3.0), Some(Number::from(3)));
        assert_eq!(number(1e300), Number::from_f64(1e300));
        assert_eq!(number(-0.25), Number::from_f64(-0.25));
        assert_eq!(number(f64::INFINITY), None);
    }
}
