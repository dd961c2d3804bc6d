//! What the tenant and subject expressions of a workload caller's entry
//! (`callers.jwt[]`, `callers.mtls[]`) name, over the verified claims or
//! certificate, with the messages every kind of caller gives alike.

use super::{Namespace, Subject, quoted};
use crate::config::ClaimExpression;

/// The tenant name `expression` gives over `value` (a string), or why it
/// names none; messages name the entry (`path`) and what was presented
/// (`what`: `token`, `certificate`).
pub(super) fn tenant(
    expression: &ClaimExpression,
    value: &serde_json::Value,
    path: &str,
    what: &str,
) -> Result<String, String> {
    match expression.evaluate(value) {
        Ok(cel::Value::String(name)) => Ok(name.to_string()),
        Ok(other) => Err(format!(
            "{path}.tenant gave a {}, not a tenant name",
            other.type_of()
        )),
        Err(reason) => Err(format!(
            "{path}.tenant names no tenant for this {what}: {}",
            quoted(&reason)
        )),
    }
}

/// The subject `expression` gives over `value` (a string, in `namespace`;
/// `null` for the tenant itself), or why it names none.
pub(super) fn subject(
    expression: &ClaimExpression,
    value: &serde_json::Value,
    path: &str,
    what: &str,
    namespace: Namespace<'_>,
) -> Result<Subject, String> {
    match expression.evaluate(value) {
        Ok(cel::Value::String(id)) => {
            Subject::named(namespace, &id).map_err(|reason| format!("{path}.subject: {reason}"))
        }
        Ok(cel::Value::Null) => Ok(Subject::tenant()),
        Ok(other) => Err(format!(
            "{path}.subject gave a {}, not a string",
            other.type_of()
        )),
        Err(reason) => Err(format!(
            "{path}.subject names no subject for this {what}: {}",
            quoted(&reason)
        )),
    }
}
