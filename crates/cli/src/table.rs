//! Plain-text tables for people: left-aligned columns, a header rule, nothing clever.

use std::io::{self, Write};

use unicode_width::UnicodeWidthStr;

/// The widest a column is padded to.
const WIDEST: usize = 200;

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// A row. Each cell is shown on one line as a person may safely see it: control sequences,
    /// newlines and direction overrides are written out (`toolgate_core::clip::printable`).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| toolgate_core::clip::printable(&c).into_owned())
                .collect(),
        );
    }

    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        // Widths in terminal columns: a CJK character or an emoji takes two, a combining mark none.
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.width()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                // A cell longer than WIDEST (a 100 KB value) is printed whole but not padded
                // to: the other rows keep a width a terminal can show.
                let n = c.width();
                if n <= WIDEST {
                    widths[i] = widths[i].max(n);
                }
            }
        }
        let line = |cells: &[String], out: &mut dyn Write| -> io::Result<()> {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    s.push_str(&" ".repeat(widths[i].saturating_sub(c.width()) + 2));
                }
            }
            writeln!(out, "{}", s.trim_end())
        };
        line(&self.header, out)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule, out)?;
        for r in &self.rows {
            line(r, out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_cell_is_printed_whole_without_widening_the_other_rows() {
        let mut t = Table::new(&["FIELD", "VALUE", "NOTES"]);
        t.row(vec!["text".into(), "x".repeat(100_000), "long".into()]);
        t.row(vec!["amount".into(), "12600.5".into(), "changed".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].contains(&"x".repeat(100_000)), "printed whole");
        assert_eq!(lines[3], "amount  12600.5  changed");
        assert!(lines[0].chars().count() < 40, "{}", lines[0]);
    }

    #[test]
    fn wide_and_multi_byte_cells_are_padded_to_the_columns_a_terminal_shows() {
        let mut t = Table::new(&["A", "B"]);
        // Z ü r i c h, a space, 東京 (two columns each), a space, 🚀 (two): 14 columns, 11
        // characters, 19 bytes.
        t.row(vec!["Zürich 東京 🚀".into(), "x".into()]);
        t.row(vec!["ab".into(), "y".into()]);
        t.row(vec!["e\u{301}".into(), "z".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Zürich 東京 🚀  x"), "{text}");
        assert!(text.contains(&format!("ab{}y", " ".repeat(14))), "{text}");
        // A combining accent takes no column of its own.
        assert!(
            text.contains(&format!("e\u{301}{}z", " ".repeat(15))),
            "{text}"
        );
        let rule = text.lines().nth(1).unwrap();
        assert_eq!(rule, format!("{}  -", "-".repeat(14)));
    }
}
