//! Plain-text tables for people: left-aligned columns, a header rule, nothing clever.

use std::io::{self, Write};

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
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String], out: &mut dyn Write| -> io::Result<()> {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<w$}  ", w = widths[i]));
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
