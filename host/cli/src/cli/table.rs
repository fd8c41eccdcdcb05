//! Plain aligned text tables for the CLI's human output.

/// Renders `rows` under `headers`, columns padded to their widest cell, two spaces apart.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            if i + 1 < cells.len() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_under_their_headers() {
        let out = render(
            &["NAME", "PARTITIONS"],
            &[
                vec!["orders".into(), "4".into()],
                vec!["a".into(), "12".into()],
            ],
        );
        assert_eq!(out, "NAME    PARTITIONS\norders  4\na       12\n");
    }
}
