//! Byte counts as people write them on command lines and in environment variables.

/// Parses a byte count such as `1073741824`, `512M`, `2GiB`, `64k` or `0`: a whole number
/// with an optional binary suffix (K, M, G, T; `B`, `KB`, `KiB` … are accepted too).
pub fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let n: u64 = num.parse().map_err(|_| {
        format!("`{text}` is not a byte count; write a whole number with an optional K, M, G or T suffix, e.g. 512M")
    })?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "`{text}` has an unknown size suffix `{other}`; use K, M, G or T"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes(" 2GiB "), Ok(2 << 30));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("1X").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
