//! What a policy condition reads of the variable `tool`: nothing, its
//! name, its server, its annotations or the whole of it, which says where
//! the condition's value may be remembered across tools.

use crate::catalog::CatalogTool;

use super::values::hints;

/// What a condition reads of `tool`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ToolReads {
    name: bool,
    server: bool,
    annotations: bool,
    /// `tool` used other than as `tool.name`, `tool.server` or
    /// `tool.annotations…`.
    whole: bool,
}

impl ToolReads {
    /// Whether it reads `tool` at all.
    pub(super) fn any(self) -> bool {
        self.name || self.server || self.annotations || self.whole
    }

    /// Whether it reads what only a tool's definition tells (its
    /// annotations, or `tool` as a whole).
    pub(super) fn definition(self) -> bool {
        self.annotations || self.whole
    }

    /// Whether it reads the tool's name.
    pub(super) fn name(self) -> bool {
        self.name
    }

    /// Where a value of the condition may be remembered for `tool`:
    /// `Some(None)`, per caller (it reads no tool); `Some(Some(key))`, per
    /// server and hints; `None`, not at all (it reads the name).
    pub(super) fn memo_key(
        self,
        rule: usize,
        tool: &CatalogTool,
    ) -> Option<Option<(usize, usize, u8)>> {
        if !self.any() {
            return Some(None);
        }
        if self.name || self.whole {
            return None;
        }
        let server = if self.server {
            tool.server_index
        } else {
            usize::MAX
        };
        let hints = if self.annotations {
            let a = hints(tool);
            u8::from(a[0]) | u8::from(a[1]) << 1 | u8::from(a[2]) << 2 | u8::from(a[3]) << 3
        } else {
            0
        };
        Some(Some((rule, server, hints)))
    }
}

/// What `expression` reads of the variable `tool`.
pub(super) fn tool_reads(expression: &cel::IdedExpr) -> ToolReads {
    fn walk<'e>(expression: &'e cel::IdedExpr, bound: &mut Vec<&'e str>, reads: &mut ToolReads) {
        use cel::common::ast::{EntryExpr, Expr, MapExpr, StructExpr};
        let free_tool = |e: &cel::IdedExpr, bound: &[&str]| {
            matches!(&e.expr, Expr::Ident(name) if name == "tool") && !bound.contains(&"tool")
        };
        match &expression.expr {
            Expr::Select(select) if free_tool(&select.operand, bound) => {
                match select.field.as_str() {
                    "name" => reads.name = true,
                    "server" => reads.server = true,
                    "annotations" => reads.annotations = true,
                    _ => reads.whole = true,
                }
            }
            Expr::Ident(name) => {
                if name == "tool" && !bound.contains(&"tool") {
                    reads.whole = true;
                }
            }
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Call(call) => {
                if let Some(target) = &call.target {
                    walk(target, bound, reads);
                }
                for arg in &call.args {
                    walk(arg, bound, reads);
                }
            }
            Expr::Comprehension(c) => {
                walk(&c.iter_range, bound, reads);
                walk(&c.accu_init, bound, reads);
                let depth = bound.len();
                bound.push(&c.iter_var);
                if let Some(second) = &c.iter_var2 {
                    bound.push(second);
                }
                bound.push(&c.accu_var);
                walk(&c.loop_cond, bound, reads);
                walk(&c.loop_step, bound, reads);
                walk(&c.result, bound, reads);
                bound.truncate(depth);
            }
            Expr::List(list) => {
                for element in &list.elements {
                    walk(element, bound, reads);
                }
            }
            Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
                for entry in entries {
                    match &entry.expr {
                        EntryExpr::StructField(field) => walk(&field.value, bound, reads),
                        EntryExpr::MapEntry(entry) => {
                            walk(&entry.key, bound, reads);
                            walk(&entry.value, bound, reads);
                        }
                    }
                }
            }
            Expr::Select(select) => walk(&select.operand, bound, reads),
        }
    }
    let mut reads = ToolReads::default();
    walk(expression, &mut Vec::new(), &mut reads);
    reads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(source: &str) -> ToolReads {
        tool_reads(cel::Program::compile(source).unwrap().expression())
    }

    #[test]
    fn reads_name_the_fields_of_tool_a_condition_uses() {
        assert!(!reads("claims.role == 'x'").any());
        assert_eq!(
            reads("tool.server == 'a' && tool.annotations.read_only"),
            ToolReads {
                server: true,
                annotations: true,
                ..ToolReads::default()
            }
        );
        assert_eq!(
            reads("{'k': tool.name}.size() > 0"),
            ToolReads {
                name: true,
                ..ToolReads::default()
            }
        );
        assert_eq!(
            reads("[tool].size() > 0"),
            ToolReads {
                whole: true,
                ..ToolReads::default()
            }
        );
        // A comprehension's own `tool` is not the variable.
        assert!(!reads("claims.groups.exists(tool, tool == 'a')").any());
    }
}
