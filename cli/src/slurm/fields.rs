//! Slurm's `print_fields` as `sacct`, `sstat`, `sshare`, `sreport` and `sacctmgr` share it: a command's table of
//! fields (name, default width, how a value is cut), `-o`/`--format` read against it (any unambiguous prefix, `%N`
//! widths, negative = left-justified), and rows in columns or `-p`/`-P` parsable layouts.

/// How a field's value is printed in columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Cut to the width with a `+` marking the cut.
    Text,
    /// Numbers and durations: never cut.
    Number,
    /// Timestamps: cut without a marker.
    Date,
}

/// A field Slurm 22.05 knows (name, default width, kind), in its order: a prefix picks the first match.
pub struct FieldDef {
    name: &'static str,
    width: i32,
    kind: Kind,
}

pub const fn def(name: &'static str, width: i32, kind: Kind) -> FieldDef {
    FieldDef { name, width, kind }
}

/// One column: its field and width (negative: left-justified, as in Slurm).
pub struct Field {
    def: &'static FieldDef,
    width: i32,
}

impl Field {
    pub fn name(&self) -> &'static str {
        self.def.name
    }
}

/// A column as Slurm's print_fields lays it out (sacct's, sstat's and sacctmgr's fields).
pub trait Column {
    fn header(&self) -> &str;
    /// Negative: left-justified.
    fn width(&self) -> i32;
    fn kind(&self) -> Kind {
        Kind::Text
    }
}

impl Column for Field {
    fn header(&self) -> &str {
        self.def.name
    }
    fn width(&self) -> i32 {
        self.width
    }
    fn kind(&self) -> Kind {
        self.def.kind
    }
}

/// [`parse_fields`] over another command's table of fields (`sstat`'s).
pub fn parse_fields_in(spec: &str, table: &'static [FieldDef]) -> anyhow::Result<Vec<Field>> {
    let mut fields = Vec::new();
    for item in spec.split(',').map(str::trim_start).filter(|f| !f.is_empty()) {
        let (name, width) = match item.split_once('%') {
            Some((n, w)) => (n, Some(atoi(w))),
            None => (item, None),
        };
        if name.eq_ignore_ascii_case("ALL") {
            fields.extend(table.iter().map(|d| Field { def: d, width: width.unwrap_or(d.width) }));
            continue;
        }
        let lower = name.to_ascii_lowercase();
        let Some(d) = table.iter().find(|d| d.name.to_ascii_lowercase().starts_with(&lower)) else {
            if ["allocgres", "reqgres"].contains(&lower.as_str()) {
                let now = if lower == "allocgres" { "AllocTRES" } else { "ReqTRES" };
                anyhow::bail!("{name} has been removed, please use {now}");
            }
            anyhow::bail!("Invalid field requested: \"{name}\"");
        };
        fields.push(Field { def: d, width: width.unwrap_or(d.width) });
    }
    Ok(fields)
}

/// C's `atoi`: an optional sign and the digits that follow; 0 when there are none.
pub fn atoi(text: &str) -> i32 {
    let (sign, digits) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let digits: String = digits.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse::<i32>().map_or(0, |n| sign * n)
}

/// How rows are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Columns,
    /// `-p` (`trailing`) or `-P`.
    Parsable {
        delimiter: String,
        trailing: bool,
    },
}

/// One row: each value as Slurm's print_fields would print it.
pub fn row<C: Column>(fields: &[C], values: &[String], layout: &Layout) -> String {
    let mut line = String::new();
    match layout {
        Layout::Parsable { delimiter, trailing } => {
            for (i, value) in values.iter().enumerate() {
                line.push_str(value);
                if *trailing || i + 1 < values.len() {
                    line.push_str(delimiter);
                }
            }
        }
        Layout::Columns => {
            for (field, value) in fields.iter().zip(values) {
                line.push_str(&cell(value, field.width(), field.kind()));
                line.push(' ');
            }
        }
    }
    line.push('\n');
    line
}

/// One column cell: cut as the kind says, right-justified for a positive width, left for a negative one.
fn cell(value: &str, width: i32, kind: Kind) -> String {
    let abs = width.unsigned_abs() as usize;
    let count = value.chars().count();
    let shown: String = match kind {
        Kind::Text if count > abs && abs > 0 => value.chars().take(abs - 1).chain(std::iter::once('+')).collect(),
        Kind::Text | Kind::Date if count > abs => value.chars().take(abs).collect(),
        _ => value.to_string(),
    };
    if width >= 0 { format!("{shown:>abs$}") } else { format!("{shown:<abs$}") }
}

pub fn header<C: Column>(fields: &[C], layout: &Layout) -> String {
    let names: Vec<String> = fields.iter().map(|f| f.header().to_string()).collect();
    match layout {
        Layout::Parsable { .. } => row(fields, &names, layout),
        Layout::Columns => {
            let mut out = String::new();
            for f in fields {
                let abs = f.width().unsigned_abs() as usize;
                let name: String = f.header().chars().take(abs).collect();
                out.push_str(&if f.width() >= 0 { format!("{name:>abs$} ") } else { format!("{name:<abs$} ") });
            }
            out.push('\n');
            for f in fields {
                out.push_str(&"-".repeat(f.width().unsigned_abs() as usize));
                out.push(' ');
            }
            out.push('\n');
            out
        }
    }
}

/// `--helpformat` over another command's table of fields (`sstat`'s).
pub fn help_format_in(table: &[FieldDef]) -> String {
    let mut out = String::new();
    for chunk in table.chunks(4) {
        let line: Vec<String> = chunk.iter().map(|f| format!("{:<20}", f.name)).collect();
        out.push_str(line.join("").trim_end());
        out.push('\n');
    }
    out
}

/// GPU-ms as GPU-hours with 4 decimals (`sacct`'s and `sreport`'s goodput fields).
pub fn gpu_hours(gpu_ms: u64) -> String {
    format!("{:.4}", gpu_ms as f64 / 3_600_000.0)
}

/// The effective training time ratio, 4 decimals.
pub fn ratio(r: f64) -> String {
    format!("{r:.4}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_cut_as_their_kind_says() {
        assert_eq!(cell("2026-12-01T10:00:00", 10, Kind::Date), "2026-12-01");
        assert_eq!(cell("12345678901", 4, Kind::Number), "12345678901", "numbers are never cut");
        assert_eq!(cell("CANCELLED by 1000", 10, Kind::Text), "CANCELLED+");
        assert_eq!(cell("ab", -4, Kind::Text), "ab  ");
        assert_eq!(atoi("-20x"), -20);
        assert_eq!(atoi("x"), 0);
    }
}
