//! `toolgate call` on a terminal: a tool's questions asked of the person at
//! the keyboard ([cli.md](../../docs/cli.md)). A form is asked one field at
//! a time, showing its title, description, type and default; a URL is
//! printed for the user to open; a sampling question is declined (a
//! terminal has no model). The user may decline or cancel every question;
//! the end of input (Ctrl-D) cancels it.
//!
//! Generic over the input and output so that tests drive it with text.

use std::io::{BufRead, Write};

use rmcp::model::{
    ElicitationSchema, EnumSchema, MultiSelectEnumSchema, PrimitiveSchemaDefinition,
    SingleSelectEnumSchema,
};
use serde_json::{Map, Value};

use crate::pb;
use crate::pb::input_request::Kind;

/// Invalid values accepted for one field before the question is cancelled.
const MAX_ATTEMPTS: usize = 5;

/// The terminal could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot ask on the terminal: {0}")]
pub(super) struct PromptError(#[from] std::io::Error);

/// Asks `question` on `out`, reading the answers from `input`.
///
/// # Errors
/// When reading or writing fails.
pub(super) fn ask(
    question: &pb::InputRequest,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<pb::InputResponse, PromptError> {
    let (action, content) = match &question.kind {
        Some(Kind::Form(form)) => ask_form(form, input, out)?,
        Some(Kind::Url(url)) => (ask_url(url, input, out)?, None),
        Some(Kind::Sampling(_)) => {
            writeln!(
                out,
                "? The tool asks for a completion by your model (sampling): a terminal has \
                 no model, so toolgate call declines it (answer it with --input FILE)."
            )?;
            (pb::InputAction::Decline, None)
        }
        None => {
            writeln!(
                out,
                "? The tool asks a question of a kind this toolgate does not know: cancelled."
            )?;
            (pb::InputAction::Cancel, None)
        }
    };
    out.flush()?;
    Ok(pb::InputResponse {
        id: question.id.clone(),
        action: action.into(),
        content_json: content
            .map(|c| Value::Object(c).to_string())
            .unwrap_or_default(),
    })
}

/// One line of input without its line end; `None` at the end of input.
fn line(input: &mut impl BufRead, out: &mut impl Write) -> Result<Option<String>, PromptError> {
    out.flush()?;
    let mut text = String::new();
    if input.read_line(&mut text)? == 0 {
        return Ok(None);
    }
    Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()))
}

/// What the user chose at a question's start.
enum Choice {
    Answer,
    Decline,
    Cancel,
}

fn choose(
    input: &mut impl BufRead,
    out: &mut impl Write,
    what: &str,
) -> Result<Choice, PromptError> {
    for _ in 0..MAX_ATTEMPTS {
        write!(out, "  {what}, d to decline, c to cancel: ")?;
        match line(input, out)?.as_deref().map(str::trim) {
            None => return Ok(Choice::Cancel),
            Some("") => return Ok(Choice::Answer),
            Some("d" | "D" | "decline") => return Ok(Choice::Decline),
            Some("c" | "C" | "cancel") => return Ok(Choice::Cancel),
            Some(_) => writeln!(out, "  (press Enter, d or c)")?,
        }
    }
    Ok(Choice::Cancel)
}

fn ask_url(
    url: &pb::UrlInput,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<pb::InputAction, PromptError> {
    writeln!(out, "? {}", url.message)?;
    writeln!(out, "  Open this URL: {}", url.url)?;
    Ok(
        match choose(input, out, "Press Enter once you have opened it")? {
            Choice::Answer => pb::InputAction::Accept,
            Choice::Decline => pb::InputAction::Decline,
            Choice::Cancel => pb::InputAction::Cancel,
        },
    )
}

type FormAnswer = (pb::InputAction, Option<Map<String, Value>>);

fn ask_form(
    form: &pb::FormInput,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<FormAnswer, PromptError> {
    writeln!(out, "? {}", form.message)?;
    let schema: Option<ElicitationSchema> = serde_json::from_str(&form.requested_schema_json).ok();
    match choose(input, out, "Press Enter to fill in the form")? {
        Choice::Answer => {}
        Choice::Decline => return Ok((pb::InputAction::Decline, None)),
        Choice::Cancel => return Ok((pb::InputAction::Cancel, None)),
    }
    let Some(schema) = schema else {
        return ask_raw(&form.requested_schema_json, input, out);
    };
    let required = schema.required.clone().unwrap_or_default();
    let order = schema
        .property_order
        .clone()
        .unwrap_or_else(|| schema.properties.keys().cloned().collect());
    let mut values = Map::new();
    for name in order {
        let Some(definition) = schema.properties.get(&name) else {
            continue;
        };
        let field = Field::of(&name, definition, required.contains(&name));
        match field.ask(input, out)? {
            Asked::Value(v) => {
                values.insert(name, v);
            }
            Asked::Skipped => {}
            Asked::Cancelled => return Ok((pb::InputAction::Cancel, None)),
        }
    }
    Ok((pb::InputAction::Accept, Some(values)))
}

/// A schema toolgate cannot read field by field: the values as one JSON
/// object.
fn ask_raw(
    schema: &str,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<FormAnswer, PromptError> {
    writeln!(out, "  The form's schema: {schema}")?;
    for _ in 0..MAX_ATTEMPTS {
        write!(out, "  Values as a JSON object> ")?;
        let Some(text) = line(input, out)? else {
            return Ok((pb::InputAction::Cancel, None));
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(values)) => return Ok((pb::InputAction::Accept, Some(values))),
            _ => writeln!(out, "  not a JSON object")?,
        }
    }
    Ok((pb::InputAction::Cancel, None))
}

/// A field's type as the prompt handles it.
#[derive(Debug, Clone, PartialEq)]
enum FieldType {
    Text {
        min: Option<u32>,
        max: Option<u32>,
        format: Option<String>,
    },
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    Number {
        min: Option<f64>,
        max: Option<f64>,
    },
    Boolean,
    /// (value, label) pairs; `multi` for a multi-select.
    Choice {
        options: Vec<(String, String)>,
        multi: bool,
    },
}

/// One form field, ready to ask.
#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: String,
    title: Option<String>,
    description: Option<String>,
    required: bool,
    kind: FieldType,
    default: Option<Value>,
}

enum Asked {
    Value(Value),
    Skipped,
    Cancelled,
}

fn cow(v: &Option<std::borrow::Cow<'static, str>>) -> Option<String> {
    v.as_ref().map(|s| s.to_string()).filter(|s| !s.is_empty())
}

impl Field {
    #[allow(clippy::too_many_lines)]
    fn of(name: &str, definition: &PrimitiveSchemaDefinition, required: bool) -> Self {
        let mut field = Field {
            name: name.to_owned(),
            title: None,
            description: None,
            required,
            kind: FieldType::Text {
                min: None,
                max: None,
                format: None,
            },
            default: None,
        };
        let plain = |values: &[String]| -> Vec<(String, String)> {
            values.iter().map(|v| (v.clone(), v.clone())).collect()
        };
        match definition {
            PrimitiveSchemaDefinition::String(s) => {
                field.title = cow(&s.title);
                field.description = cow(&s.description);
                field.kind = FieldType::Text {
                    min: s.min_length,
                    max: s.max_length,
                    format: s
                        .format
                        .and_then(|f| serde_json::to_value(f).ok())
                        .and_then(|v| v.as_str().map(str::to_owned)),
                };
                field.default = s.default.clone().map(Value::String);
            }
            PrimitiveSchemaDefinition::Integer(s) => {
                field.title = cow(&s.title);
                field.description = cow(&s.description);
                field.kind = FieldType::Integer {
                    min: s.minimum,
                    max: s.maximum,
                };
                field.default = s.default.map(Value::from);
            }
            PrimitiveSchemaDefinition::Number(s) => {
                field.title = cow(&s.title);
                field.description = cow(&s.description);
                field.kind = FieldType::Number {
                    min: s.minimum,
                    max: s.maximum,
                };
                field.default = s.default.map(Value::from);
            }
            PrimitiveSchemaDefinition::Boolean(s) => {
                field.title = cow(&s.title);
                field.description = cow(&s.description);
                field.kind = FieldType::Boolean;
                field.default = s.default.map(Value::Bool);
            }
            PrimitiveSchemaDefinition::Enum(EnumSchema::Single(single)) => {
                let (title, description, options, default) = match single {
                    SingleSelectEnumSchema::Untitled(s) => {
                        (&s.title, &s.description, plain(&s.enum_), &s.default)
                    }
                    SingleSelectEnumSchema::Titled(s) => (
                        &s.title,
                        &s.description,
                        s.one_of
                            .iter()
                            .map(|c| (c.const_.clone(), c.title.clone()))
                            .collect(),
                        &s.default,
                    ),
                    #[allow(unreachable_patterns)]
                    _ => (&None, &None, Vec::new(), &None),
                };
                field.title = cow(title);
                field.description = cow(description);
                field.kind = FieldType::Choice {
                    options,
                    multi: false,
                };
                field.default = default.clone().map(Value::String);
            }
            PrimitiveSchemaDefinition::Enum(EnumSchema::Legacy(s)) => {
                field.title = cow(&s.title);
                field.description = cow(&s.description);
                let names = s.enum_names.clone().unwrap_or_default();
                field.kind = FieldType::Choice {
                    options: s
                        .enum_
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (v.clone(), names.get(i).cloned().unwrap_or(v.clone())))
                        .collect(),
                    multi: false,
                };
                field.default = s.default.clone().map(Value::String);
            }
            PrimitiveSchemaDefinition::Enum(EnumSchema::Multi(multi)) => {
                let (title, description, options, default) = match multi {
                    MultiSelectEnumSchema::Untitled(s) => {
                        (&s.title, &s.description, plain(&s.items.enum_), &s.default)
                    }
                    MultiSelectEnumSchema::Titled(s) => (
                        &s.title,
                        &s.description,
                        s.items
                            .any_of
                            .iter()
                            .map(|c| (c.const_.clone(), c.title.clone()))
                            .collect(),
                        &s.default,
                    ),
                    #[allow(unreachable_patterns)]
                    _ => (&None, &None, Vec::new(), &None),
                };
                field.title = cow(title);
                field.description = cow(description);
                field.kind = FieldType::Choice {
                    options,
                    multi: true,
                };
                field.default = default
                    .clone()
                    .map(|d| Value::Array(d.into_iter().map(Value::String).collect()));
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
        field
    }

    /// The lines shown before the field's prompt.
    fn render(&self) -> String {
        let kind = match &self.kind {
            FieldType::Text {
                format: Some(f), ..
            } => format!("text, {f}"),
            FieldType::Text { .. } => "text".to_owned(),
            FieldType::Integer { .. } => "integer".to_owned(),
            FieldType::Number { .. } => "number".to_owned(),
            FieldType::Boolean => "y/n".to_owned(),
            FieldType::Choice { multi: false, .. } => "one of".to_owned(),
            FieldType::Choice { multi: true, .. } => "any of, separated by commas".to_owned(),
        };
        let mut facts = vec![kind];
        match &self.kind {
            FieldType::Text { min, max, .. } => facts.extend(range("characters", *min, *max)),
            FieldType::Integer { min, max } => facts.extend(range("value", *min, *max)),
            FieldType::Number { min, max } => facts.extend(range("value", *min, *max)),
            _ => {}
        }
        if self.required {
            facts.push("required".to_owned());
        }
        if let Some(default) = &self.default {
            facts.push(format!("default {}", shown(default, &self.kind)));
        }
        let mut text = match &self.title {
            Some(title) if *title != self.name => format!("  {title} [{}]", self.name),
            _ => format!("  {}", self.name),
        };
        text.push_str(&format!(" ({})\n", facts.join(", ")));
        if let Some(description) = &self.description {
            for line in description.lines() {
                text.push_str(&format!("    {line}\n"));
            }
        }
        if let FieldType::Choice { options, .. } = &self.kind {
            for (n, (value, label)) in options.iter().enumerate() {
                if label == value {
                    text.push_str(&format!("    {}) {value}\n", n + 1));
                } else {
                    text.push_str(&format!("    {}) {label} ({value})\n", n + 1));
                }
            }
        }
        text
    }

    fn ask(&self, input: &mut impl BufRead, out: &mut impl Write) -> Result<Asked, PromptError> {
        write!(out, "{}", self.render())?;
        for _ in 0..MAX_ATTEMPTS {
            write!(out, "  > ")?;
            let Some(text) = line(input, out)? else {
                return Ok(Asked::Cancelled);
            };
            let text = text.trim();
            if text.is_empty() {
                if let Some(default) = &self.default {
                    return Ok(Asked::Value(default.clone()));
                }
                if !self.required {
                    return Ok(Asked::Skipped);
                }
                writeln!(out, "  a value is required")?;
                continue;
            }
            match self.parse(text) {
                Ok(value) => return Ok(Asked::Value(value)),
                Err(problem) => writeln!(out, "  {problem}")?,
            }
        }
        writeln!(out, "  too many invalid answers: the question is cancelled")?;
        Ok(Asked::Cancelled)
    }

    /// The value typed for this field, or why it does not fit.
    fn parse(&self, text: &str) -> Result<Value, String> {
        match &self.kind {
            FieldType::Text { min, max, .. } => {
                let n = text.chars().count();
                if min.is_some_and(|m| n < m as usize) || max.is_some_and(|m| n > m as usize) {
                    return Err(format!("{n} characters: out of range"));
                }
                Ok(Value::String(text.to_owned()))
            }
            FieldType::Integer { min, max } => {
                let v: i64 = text
                    .parse()
                    .map_err(|_| format!("{text:?} is not an integer"))?;
                if min.is_some_and(|m| v < m) || max.is_some_and(|m| v > m) {
                    return Err(format!("{v} is out of range"));
                }
                Ok(Value::from(v))
            }
            FieldType::Number { min, max } => {
                let v: f64 = text
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite())
                    .ok_or_else(|| format!("{text:?} is not a number"))?;
                if min.is_some_and(|m| v < m) || max.is_some_and(|m| v > m) {
                    return Err(format!("{v} is out of range"));
                }
                Ok(Value::from(v))
            }
            FieldType::Boolean => match text.to_ascii_lowercase().as_str() {
                "y" | "yes" | "true" => Ok(Value::Bool(true)),
                "n" | "no" | "false" => Ok(Value::Bool(false)),
                _ => Err("answer y or n".to_owned()),
            },
            FieldType::Choice { options, multi } => {
                let pick = |item: &str| -> Result<Value, String> {
                    let item = item.trim();
                    item.parse::<usize>()
                        .ok()
                        .and_then(|n| n.checked_sub(1))
                        .and_then(|n| options.get(n))
                        .or_else(|| options.iter().find(|(v, _)| v == item))
                        .map(|(v, _)| Value::String(v.clone()))
                        .ok_or_else(|| format!("{item:?} is not one of the choices"))
                };
                if *multi {
                    text.split(',')
                        .filter(|s| !s.trim().is_empty())
                        .map(pick)
                        .collect::<Result<Vec<_>, _>>()
                        .map(Value::Array)
                } else {
                    pick(text)
                }
            }
        }
    }
}

fn range<T: std::fmt::Display>(what: &str, min: Option<T>, max: Option<T>) -> Option<String> {
    match (min, max) {
        (Some(a), Some(b)) => Some(format!("{what} {a}..{b}")),
        (Some(a), None) => Some(format!("{what} >= {a}")),
        (None, Some(b)) => Some(format!("{what} <= {b}")),
        (None, None) => None,
    }
}

/// A default as the user would type it.
fn shown(value: &Value, kind: &FieldType) -> String {
    match (value, kind) {
        (Value::Bool(true), _) => "y".to_owned(),
        (Value::Bool(false), _) => "n".to_owned(),
        (Value::String(s), _) => format!("{s:?}"),
        (Value::Array(items), _) => items
            .iter()
            .map(|i| i.as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join(","),
        (other, _) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The booking form of tests/fixtures/python/input_server.py.
    const BOOKING: &str = r#"{"type":"object","properties":{
        "party_size":{"type":"integer","title":"Party size","description":"How many guests","minimum":1,"maximum":12},
        "date":{"type":"string","default":"2026-12-24"},
        "confirm":{"type":"boolean"}},
        "required":["party_size","confirm"]}"#;

    fn form(schema: &str) -> pb::InputRequest {
        pb::InputRequest {
            id: "q1".to_owned(),
            kind: Some(Kind::Form(pb::FormInput {
                message: "Book a table at Chez Rust?".to_owned(),
                requested_schema_json: schema.to_owned(),
            })),
        }
    }

    fn run(question: &pb::InputRequest, typed: &str) -> (pb::InputResponse, String) {
        let mut input = std::io::Cursor::new(typed.as_bytes().to_vec());
        let mut out = Vec::new();
        let answer = ask(question, &mut input, &mut out).unwrap();
        (answer, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_form_is_asked_field_by_field_in_the_servers_order() {
        // Enter, then: required integer given after a refusal and an
        // out-of-range value, the default date kept, confirm typed.
        let (answer, shown) = run(&form(BOOKING), "\n\nseven\n20\n4\n\ny\n");
        assert_eq!(answer.action(), pb::InputAction::Accept);
        let content: Value = serde_json::from_str(&answer.content_json).unwrap();
        assert_eq!(
            content,
            serde_json::json!({"party_size": 4, "date": "2026-12-24", "confirm": true})
        );
        let expected = "\
? Book a table at Chez Rust?
  Press Enter to fill in the form, d to decline, c to cancel:   \
Party size [party_size] (integer, value 1..12, required)
    How many guests
  >   a value is required
  >   \"seven\" is not an integer
  >   20 is out of range
  >   date (text, default \"2026-12-24\")
  >   confirm (y/n, required)
  > ";
        assert_eq!(shown, expected);
    }

    #[test]
    fn decline_cancel_and_end_of_input() {
        let (answer, _) = run(&form(BOOKING), "d\n");
        assert_eq!(
            (answer.action(), answer.content_json.as_str()),
            (pb::InputAction::Decline, "")
        );
        let (answer, _) = run(&form(BOOKING), "c\n");
        assert_eq!(answer.action(), pb::InputAction::Cancel);
        // Ctrl-D in the middle of the form cancels it, sending nothing typed.
        let (answer, _) = run(&form(BOOKING), "\n3\n");
        assert_eq!(
            (answer.action(), answer.content_json.as_str()),
            (pb::InputAction::Cancel, "")
        );
    }

    #[test]
    fn enums_booleans_and_optional_fields() {
        let schema = r#"{"type":"object","properties":{
            "colour":{"type":"string","oneOf":[{"const":"r","title":"Red"},{"const":"g","title":"Green"}],"default":"g"},
            "sizes":{"type":"array","items":{"type":"string","enum":["S","M","L"]}},
            "note":{"type":"string","description":"Anything else"},
            "urgent":{"type":"boolean","default":false}},
            "required":["sizes"]}"#;
        let (answer, shown) = run(&form(schema), "\n1\nmaybe\nM, 3\n\nyes\n");
        let content: Value = serde_json::from_str(&answer.content_json).unwrap();
        assert_eq!(
            content,
            serde_json::json!({"colour": "r", "sizes": ["M", "L"], "urgent": true}),
            "{shown}"
        );
        assert!(
            shown.contains("  colour (one of, default \"g\")\n    1) Red (r)\n    2) Green (g)\n"),
            "{shown}"
        );
        assert!(
            shown.contains("  sizes (any of, separated by commas, required)\n    1) S\n"),
            "{shown}"
        );
        assert!(
            shown.contains("\"maybe\" is not one of the choices"),
            "{shown}"
        );
        assert!(
            shown.contains("  note (text)\n    Anything else\n"),
            "{shown}"
        );
        assert!(shown.contains("  urgent (y/n, default n)\n"), "{shown}");
    }

    #[test]
    fn too_many_invalid_values_cancel_the_question() {
        let (answer, shown) = run(&form(BOOKING), "\nx\nx\nx\nx\nx\n4\n");
        assert_eq!(answer.action(), pb::InputAction::Cancel, "{shown}");
        assert!(shown.contains("too many invalid answers"), "{shown}");
    }

    #[test]
    fn a_url_is_printed_and_enter_accepts() {
        let question = pb::InputRequest {
            id: "link-1".to_owned(),
            kind: Some(Kind::Url(pb::UrlInput {
                message: "Open the link to continue".to_owned(),
                url: "https://example.test/pay?x=1".to_owned(),
                elicitation_id: "link-1".to_owned(),
            })),
        };
        let (answer, shown) = run(&question, "\n");
        assert_eq!(
            (answer.action(), answer.content_json.as_str()),
            (pb::InputAction::Accept, "")
        );
        assert!(
            shown.starts_with(
                "? Open the link to continue\n  Open this URL: https://example.test/pay?x=1\n"
            ),
            "{shown}"
        );
        let (answer, _) = run(&question, "d\n");
        assert_eq!(answer.action(), pb::InputAction::Decline);
    }

    #[test]
    fn sampling_is_declined_with_a_note() {
        let question = pb::InputRequest {
            id: "s".to_owned(),
            kind: Some(Kind::Sampling(pb::SamplingInput {
                params_json: "{}".to_owned(),
            })),
        };
        let (answer, shown) = run(&question, "");
        assert_eq!(answer.action(), pb::InputAction::Decline);
        assert!(shown.contains("a terminal has no model"), "{shown}");
    }

    #[test]
    fn an_unreadable_schema_takes_one_json_object() {
        let (answer, shown) = run(
            &form(r#"{"type":"object","properties":{"x":{"type":"object"}}}"#),
            "\n[1]\n{\"x\":{}}\n",
        );
        assert_eq!(answer.action(), pb::InputAction::Accept, "{shown}");
        assert_eq!(answer.content_json, r#"{"x":{}}"#);
        assert!(shown.contains("not a JSON object"), "{shown}");
    }
}
