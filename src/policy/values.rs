//! The CEL values a condition is evaluated over: `tool` (its name, server
//! and hints), `prompt` (its name and server), `resource` (its server and
//! URI), `claims` (a JSON value), `args` (a call's arguments, a JSON
//! object) and `caller` (how it authenticated), each borrowing its
//! strings.

use std::collections::HashMap;

use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::common::value::Val;

use crate::catalog::{CatalogPrompt, CatalogTool};

/// A tool's hints, unset ones taking the MCP defaults: read_only (false),
/// destructive (true), idempotent (false), open_world (true).
pub(super) fn hints(tool: &CatalogTool) -> [bool; 4] {
    let a = &tool.annotations;
    [
        a.read_only.unwrap_or(false),
        a.destructive.unwrap_or(true),
        a.idempotent.unwrap_or(false),
        a.open_world.unwrap_or(true),
    ]
}

/// The `tool` variable: `name`, `server` and `annotations` (`read_only`,
/// `destructive`, `idempotent`, `open_world`, see [`hints`]), borrowing
/// the tool's strings.
pub(super) fn tool_val(tool: &CatalogTool) -> Box<dyn Val + '_> {
    let [read_only, destructive, idempotent, open_world] = hints(tool);
    let annotations: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = HashMap::from([
        (CelMapKey::from("read_only"), boolean(read_only)),
        (CelMapKey::from("destructive"), boolean(destructive)),
        (CelMapKey::from("idempotent"), boolean(idempotent)),
        (CelMapKey::from("open_world"), boolean(open_world)),
    ]);
    let fields: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = HashMap::from([
        (
            CelMapKey::from("name"),
            Box::new(CelString::from(tool.name.as_str())) as Box<dyn Val>,
        ),
        (
            CelMapKey::from("server"),
            Box::new(CelString::from(tool.server.as_str())),
        ),
        (
            CelMapKey::from("annotations"),
            Box::new(CelMap::from(annotations)),
        ),
    ]);
    Box::new(CelMap::from(fields))
}

/// The `prompt` variable: `name` (exposed) and `server`, borrowing the
/// prompt's strings.
pub(super) fn prompt_val(prompt: &CatalogPrompt) -> Box<dyn Val + '_> {
    strings([
        ("name", prompt.name.as_str()),
        ("server", prompt.server.as_str()),
    ])
}

/// A skill's fields (`name`, `server`, `uri`), for completeness of the
/// targets: no condition reads a `skill` variable (skills are decided by
/// the name rules alone, as a condition reading nothing of them sees).
pub(super) fn skill_val(skill: &crate::catalog::CatalogSkill) -> Box<dyn Val + '_> {
    strings([
        ("name", skill.name.as_str()),
        ("server", skill.server.as_str()),
        ("uri", skill.uri.as_str()),
    ])
}

/// The `resource` variable: `server` and `uri` (a resource's URI, or a
/// resource template's URI template).
pub(super) fn resource_val<'v>(server: &'v str, uri: &'v str) -> Box<dyn Val + 'v> {
    strings([("server", server), ("uri", uri)])
}

/// A map of string fields.
fn strings<'v, const N: usize>(fields: [(&'static str, &'v str); N]) -> Box<dyn Val + 'v> {
    let fields: HashMap<CelMapKey<'_>, Box<dyn Val + 'v>> = fields
        .into_iter()
        .map(|(key, value)| {
            (
                CelMapKey::from(key),
                Box::new(CelString::from(value)) as Box<dyn Val>,
            )
        })
        .collect();
    Box::new(CelMap::from(fields))
}

/// The `caller` variable: `kind` (`"token"`, `"jwt"`, `"cert"` or
/// `"approver_token"`) and `issuer` (the JWT's `iss`; a certificate's
/// SPIFFE trust domain, `""` without one; `""` for a static token and an
/// approver token), borrowing its strings.
pub(super) fn caller_val(caller: &crate::callers::Caller) -> Box<dyn Val + '_> {
    use crate::callers::CallerIdentity;
    let (kind, issuer) = match &caller.identity {
        CallerIdentity::Token { .. } => ("token", ""),
        CallerIdentity::Jwt { issuer, .. } => ("jwt", issuer.as_str()),
        CallerIdentity::Certificate { trust_domain, .. } => ("cert", trust_domain.as_str()),
        CallerIdentity::ApproverToken { .. } => ("approver_token", ""),
    };
    let fields: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = HashMap::from([
        (
            CelMapKey::from("kind"),
            Box::new(CelString::from(kind)) as Box<dyn Val>,
        ),
        (CelMapKey::from("issuer"), Box::new(CelString::from(issuer))),
    ]);
    Box::new(CelMap::from(fields))
}

/// A boolean as a CEL value.
fn boolean<'v>(value: bool) -> Box<dyn Val + 'v> {
    Box::new(CelBool::from(value))
}

/// A JSON value (the claims) as a CEL value, borrowing its strings.
pub(super) fn json_val(value: &serde_json::Value) -> Box<dyn Val + '_> {
    use serde_json::Value as Json;
    match value {
        Json::Null => Box::new(CelNull),
        Json::Bool(b) => boolean(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            (None, None) => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        Json::String(text) => Box::new(CelString::from(text.as_str())),
        Json::Array(items) => Box::new(CelList::from(
            items.iter().map(json_val).collect::<Vec<_>>(),
        )),
        Json::Object(map) => object_val(map),
    }
}

/// A JSON object (the claims' parts, a call's `args`) as a CEL map,
/// borrowing its strings: key order does not matter.
pub(super) fn object_val(map: &serde_json::Map<String, serde_json::Value>) -> Box<dyn Val + '_> {
    Box::new(CelMap::from(
        map.iter()
            .map(|(k, v)| (CelMapKey::from(k.as_str()), json_val(v)))
            .collect::<HashMap<_, _>>(),
    ))
}
