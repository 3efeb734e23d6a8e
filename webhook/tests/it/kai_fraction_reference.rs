//! Property test of the `gpu-fraction` parser against an independent arbitrary-precision
//! reference, over generated strings (default 200,000; set `HAMI_FRACTION_CASES` for more, e.g.
//! `HAMI_FRACTION_CASES=2000000 cargo test --release -p hami-webhook --test it kai_fraction_reference::`).
//!
//! The reference restates what KAI accepts in its own terms: Go's `strconv.ParseFloat` syntax
//! without hex or `_` (which `resource.ParseQuantity` refuses), the value as a big integer times a
//! power of ten, and the `f64` rounding bounds as comparisons of big integers (no digit strings
//! shared with the parser). For every accepted value, `of(mib)` must equal
//! `floor(value × mib)` computed with big integers.

use hami_webhook::policy::kai::quantity::{Fraction, KaiValueError};
use num_bigint::BigUint;

/// What the reference says about a string.
#[derive(Debug, PartialEq)]
enum Expected {
    Syntax,
    Range,
    Rounds,
    Value { num: BigUint, exp10: i64 },
}

fn pow10(n: u64) -> BigUint {
    BigUint::from(10u32).pow(u32::try_from(n).unwrap())
}

fn reference(s: &str) -> Expected {
    if s.is_empty() {
        return Expected::Syntax;
    }
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (negative, mantissa) = if let Some(m) = mantissa.strip_prefix('-') {
        (true, m)
    } else {
        (false, mantissa.strip_prefix('+').unwrap_or(mantissa))
    };
    let dots = mantissa.chars().filter(|&c| c == '.').count();
    let digit_count = mantissa.chars().filter(char::is_ascii_digit).count();
    if dots > 1 || digit_count == 0 || digit_count + dots != mantissa.len() {
        return Expected::Syntax;
    }
    let mut exp10: i64 = 0;
    if let Some(e) = exponent {
        let (e_neg, digits) = if let Some(d) = e.strip_prefix('-') {
            (true, d)
        } else {
            (false, e.strip_prefix('+').unwrap_or(e))
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            return Expected::Syntax;
        }
        // Go's readFloat: digits are added only while the exponent is below 10000.
        let mut v: i64 = 0;
        for c in digits.chars() {
            if v < 10_000 {
                v = v * 10 + i64::from(c.to_digit(10).unwrap());
            }
        }
        exp10 = if e_neg { -v } else { v };
    }
    let after_dot = mantissa.split_once('.').map_or(0, |(_, f)| f.len());
    exp10 -= i64::try_from(after_dot).unwrap();
    let all: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let num = BigUint::parse_bytes(all.as_bytes(), 10).unwrap();
    if negative || num == BigUint::from(0u32) {
        return Expected::Range;
    }
    // x = num × 10^exp10. Compare x with 1, 1 − 2^-54 and 2^-1075 as big integers.
    let (lhs_scale, rhs_scale) = if exp10 >= 0 {
        (pow10(exp10.unsigned_abs()), BigUint::from(1u32))
    } else {
        (BigUint::from(1u32), pow10(exp10.unsigned_abs()))
    };
    let x_num = &num * &lhs_scale; // x = x_num / rhs_scale
    if x_num >= rhs_scale {
        return Expected::Range;
    }
    let two54 = BigUint::from(1u32) << 54u32;
    // x ≥ 1 − 2^-54  ⟺  x_num × 2^54 ≥ (2^54 − 1) × rhs_scale
    if &x_num * &two54 >= (&two54 - 1u32) * &rhs_scale {
        return Expected::Rounds;
    }
    // x ≤ 2^-1075  ⟺  x_num × 2^1075 ≤ rhs_scale (impossible below 2^1075: x_num ≥ 1)
    if rhs_scale.bits() > 1075 && (&x_num << 1075u32) <= rhs_scale {
        return Expected::Rounds;
    }
    Expected::Value { num, exp10 }
}

/// splitmix64: a small deterministic generator (the seed is printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn digits(&mut self, out: &mut String, max: u64) {
        let n = self.below(max + 1);
        let style = self.below(4);
        for _ in 0..n {
            let d = match style {
                0 => b'0',
                1 => b'9',
                _ => b'0' + u8::try_from(self.below(10)).unwrap(),
            };
            // Mostly the style's digit, sometimes any.
            let d = if style < 2 && self.chance(80) {
                d
            } else {
                b'0' + u8::try_from(self.below(10)).unwrap()
            };
            out.push(char::from(d));
        }
    }
}

const NEAR_ONE: &str = "0.999999999999999944488848768742172978818416595458984375";
const NEAR_ZERO: &str = "2.4703282292062327208828439643411068618252990130716238221279284125033775363510437593264991818081799618989828234772285886546332835517796989819938739800539093906315035659515570226392290858392449105184435931802849936536152500319370457678249219365623669863658480757001585769269903706311928279558551332927834338409351978015531246597263579574622766465272827220056374006485499977096599470454020828166226237857393450736339007967761930577506740176324673600968951340535537458516661134223766678604162159680461914467291840300530057530849048765391711386591646239524912623653881879636239373280423891018672348497668235089863388587925628302755995657524455507255189313690836254779186948667994968324049705821028513185451396213837722826145437693412532098591327667236328125e-324";

fn generate(rng: &mut Rng, out: &mut String) {
    out.clear();
    match rng.below(20) {
        // Near the f64 bounds: a prefix of the exact midpoint, then anything (near 0 more rarely:
        // its 750-digit values cost the reference ~1000x a plain case).
        0 => {
            let src = if rng.below(25) == 0 {
                NEAR_ZERO
            } else {
                NEAR_ONE
            };
            let (mantissa, exp) = src.split_once('e').map_or((src, ""), |(m, e)| (m, e));
            let cut = 2 + usize::try_from(rng.below(mantissa.len() as u64 - 1)).unwrap();
            out.push_str(&mantissa[..cut.min(mantissa.len())]);
            rng.digits(out, 4);
            if !exp.is_empty() {
                out.push('e');
                out.push_str(exp);
            }
        }
        _ => {
            match rng.below(8) {
                0 => out.push('+'),
                1 => out.push('-'),
                _ => {}
            }
            if rng.chance(60) {
                out.push_str(&"0".repeat(usize::try_from(rng.below(3)).unwrap()));
            } else {
                rng.digits(out, 3);
            }
            if rng.chance(85) {
                out.push('.');
            }
            rng.digits(out, 22);
            if rng.chance(50) {
                out.push(if rng.chance(70) { 'e' } else { 'E' });
                match rng.below(3) {
                    0 => out.push('+'),
                    1 => out.push('-'),
                    _ => {}
                }
                // Mostly small exponents; a few large ones (Go's accumulation cap).
                let n = if rng.chance(97) { 3 } else { 7 };
                rng.digits(out, n);
            }
        }
    }
    // Mutations: a foreign character, a deleted one, or a truncation.
    if rng.chance(12) && !out.is_empty() {
        const NOISE: &[u8] = b"_xXpP.eE+- \tinfaNm0123456789kMGi\n";
        let at = usize::try_from(rng.below(out.len() as u64 + 1)).unwrap();
        match rng.below(3) {
            0 => {
                let c = NOISE[usize::try_from(rng.below(NOISE.len() as u64)).unwrap()];
                out.insert(at, char::from(c));
            }
            1 if at < out.len() => {
                out.remove(at);
            }
            _ => out.truncate(at),
        }
    }
}

fn classify(got: &Result<Fraction, KaiValueError>) -> &'static str {
    match got {
        Ok(_) => "ok",
        Err(KaiValueError::Empty | KaiValueError::FractionNotDecimal) => "syntax",
        Err(KaiValueError::FractionOutOfRange) => "range",
        Err(KaiValueError::FractionRoundsToBound) => "rounds",
        Err(_) => "other",
    }
}

#[test]
fn parser_agrees_with_the_big_integer_reference() {
    let cases: u64 = std::env::var("HAMI_FRACTION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let seed: u64 = std::env::var("HAMI_FRACTION_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_f4ac_7105);
    let mut rng = Rng(seed);
    let bases: [u64; 7] = [1, 100, 1024, 81_920, 143_771, u64::MAX >> 20, u64::MAX];
    let mut text = String::new();
    let mut counts = std::collections::BTreeMap::<&str, u64>::new();
    let mut f64_checked = 0u64;
    for case in 0..cases {
        generate(&mut rng, &mut text);
        let got = Fraction::parse(&text);
        let expected = reference(&text);
        let want = match &expected {
            Expected::Syntax => "syntax",
            Expected::Range => "range",
            Expected::Rounds => "rounds",
            Expected::Value { .. } => "ok",
        };
        assert_eq!(
            classify(&got),
            want,
            "case {case} (seed {seed}): {text:?}: parser {got:?}, reference {expected:?}"
        );
        *counts.entry(want).or_default() += 1;
        // A second, independent check: Rust's own correctly rounded f64 parser, on the plain
        // decimal forms (it also reads "inf" and "nan", which KAI refuses) short enough that Go's
        // exponent cap cannot matter.
        if text.len() < 64 && text.bytes().all(|b| b"0123456789.eE+-".contains(&b)) {
            let in_range = text.parse::<f64>().is_ok_and(|v| v > 0.0 && v < 1.0);
            assert_eq!(
                got.is_ok(),
                in_range,
                "case {case}: {text:?}: f64 disagrees"
            );
            f64_checked += 1;
        }
        if let (Ok(f), Expected::Value { num, exp10 }) = (&got, &expected) {
            // exp10 < 0 for every value below 1.
            let scale = pow10(exp10.unsigned_abs());
            for mib in bases {
                // floor(num × 10^exp10 × mib)
                let exact = (num * BigUint::from(mib)) / &scale;
                let exact = u64::try_from(exact).unwrap();
                assert_eq!(f.of(mib), exact, "case {case}: {text:?} x {mib}");
            }
        }
    }
    println!(
        "{cases} generated strings (seed {seed}): {counts:?}; {f64_checked} also checked against f64"
    );
    // The generator must reach every class, or the test would prove little.
    for class in ["syntax", "range", "rounds", "ok"] {
        assert!(
            counts.get(class).copied().unwrap_or(0) * 200 >= cases.min(200_000),
            "{class}: {counts:?}"
        );
    }
}
