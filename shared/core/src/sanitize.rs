//! Characters that steer a display rather than say anything, removed from text on its way in.
//!
//! A memory's text ends up in two places that obey such characters: a terminal (grpcurl, logs,
//! an operator's `psql`) and an LLM's context. ANSI/VT escape sequences can recolor, clear or
//! rewrite a terminal; a carriage return or backspace can overwrite what was shown; the
//! bidirectional embedding, override and isolate controls (U+202A–U+202E, U+2066–U+2069) reorder
//! the characters that follow, so that what a reader sees differs from what the model reads
//! ("Trojan Source"). None of them carries meaning a user wants remembered, so they are removed:
//!
//! - escape sequences whole: CSI (`ESC [` … final byte, or the 8-bit U+009B), OSC / DCS / SOS /
//!   PM / APC strings up to their terminator (BEL or ST), and two-character escapes;
//! - every other C0 and C1 control and DEL, except tab and line feed; a carriage return becomes a
//!   line feed (CRLF one line feed), so line breaks survive;
//! - the bidi embedding, override and isolate controls. The direction marks (LRM, RLM, ALM) stay:
//!   they only settle neutral characters and are written by right-to-left keyboards.
//!
//! Zero-width joiners and the like also stay (emoji sequences and Persian need them); a text of
//! nothing but invisible characters is refused by validation instead.

use std::borrow::Cow;

const ESC: char = '\u{1B}';
const BEL: char = '\u{07}';
/// 8-bit String Terminator.
const ST: char = '\u{9C}';

/// Whether a character reorders the text after it (bidi embedding, override or isolate).
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether `strip_steering` would change anything in a text holding this character.
fn needs_attention(c: char) -> bool {
    (c.is_control() && c != '\t' && c != '\n') || is_bidi_control(c)
}

/// The text without escape sequences, controls (other than tab and line breaks) and bidi
/// controls; borrowed unchanged when there is nothing to remove.
pub fn strip_steering(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_attention) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ESC => match chars.peek().copied() {
                Some('[') => {
                    chars.next();
                    skip_control_sequence(&mut chars);
                }
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    chars.next();
                    skip_control_string(&mut chars);
                }
                // ESC, intermediates (0x20–0x2F), then one final character.
                Some(next) if (' '..='~').contains(&next) => {
                    while chars.next_if(|c| (' '..='/').contains(c)).is_some() {}
                    chars.next_if(|c| ('0'..='~').contains(c));
                }
                _ => {}
            },
            '\u{9B}' => skip_control_sequence(&mut chars),
            '\u{9D}' | '\u{90}' | '\u{98}' | '\u{9E}' | '\u{9F}' => skip_control_string(&mut chars),
            '\r' => {
                chars.next_if_eq(&'\n');
                out.push('\n');
            }
            c if needs_attention(c) => {}
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// After `ESC [`: parameter bytes, intermediate bytes, one final byte (0x40–0x7E).
fn skip_control_sequence(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars.next_if(|c| ('0'..='?').contains(c)).is_some() {}
    while chars.next_if(|c| (' '..='/').contains(c)).is_some() {}
    chars.next_if(|c| ('@'..='~').contains(c));
}

/// After `ESC ]` (and the other string introducers): everything up to BEL or ST (`ESC \` or
/// U+009C), or the end of the text.
fn skip_control_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            BEL | ST => return,
            ESC => {
                chars.next_if_eq(&'\\');
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn escape_sequences_go_whole() {
        for (raw, clean) in [
            ("\u{1b}[31mred\u{1b}[0m alert", "red alert"),
            ("\u{1b}[2J\u{1b}[Hcleared", "cleared"),
            ("\u{1b}[38;5;196mcolour", "colour"),
            ("title\u{1b}]0;pwned\u{07} here", "title here"),
            (
                "link \u{1b}]8;;http://x\u{1b}\\text\u{1b}]8;;\u{1b}\\",
                "link text",
            ),
            ("\u{9b}1mbold", "bold"),
            ("keypad\u{1b}=on", "keypadon"),
            ("charset\u{1b}(Bset", "charsetset"),
            ("dangling\u{1b}", "dangling"),
        ] {
            assert_eq!(strip_steering(raw), clean, "{raw:?}");
        }
    }

    #[test]
    fn controls_and_bidi_overrides_go_line_breaks_stay() {
        assert_eq!(strip_steering("a\tb\nc"), "a\tb\nc");
        assert!(matches!(
            strip_steering("plain text, 中文"),
            Cow::Borrowed(_)
        ));
        assert_eq!(strip_steering("one\r\ntwo\rthree"), "one\ntwo\nthree");
        assert_eq!(
            strip_steering("pass\u{8}\u{8}\u{8}\u{8}word\u{7f}"),
            "password"
        );
        // "Trojan Source": an override makes a reader see something else than what is there.
        assert_eq!(
            strip_steering("access = \"user\u{202E} \u{2066}// admin\u{2069} \u{2066}\""),
            "access = \"user // admin \""
        );
        // Direction marks and joiners carry meaning and stay.
        assert_eq!(strip_steering("שלום\u{200F}!"), "שלום\u{200F}!");
        assert_eq!(strip_steering("👩\u{200D}💻"), "👩\u{200D}💻");
    }

    proptest! {
        #[test]
        fn nothing_steering_survives_and_a_second_pass_changes_nothing(text in any::<String>()) {
            let once = strip_steering(&text).into_owned();
            prop_assert!(!once.chars().any(needs_attention), "{once:?}");
            prop_assert_eq!(strip_steering(&once), once.as_str());
        }

        #[test]
        fn text_without_steering_is_kept_as_is(text in "[a-zA-Z0-9 .,!?\n\t\u{4e00}-\u{4e20}]*") {
            prop_assert_eq!(strip_steering(&text), text.as_str());
        }
    }
}
