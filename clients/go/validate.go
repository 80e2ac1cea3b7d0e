package oncegate

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
)

// DefaultMaxPayloadBytes is the sidecar's default payload limit
// (ONCEGATE_MAX_PAYLOAD_BYTES may set another).
const DefaultMaxPayloadBytes = 1024 * 1024

// MaxAwardIDChars is the longest award id, in characters (Unicode scalar values).
const MaxAwardIDChars = 128

// Validate checks a submission as the sidecar does (DESIGN §1) and returns
// the same error it would: an *Error with the same code and message, or nil.
// It uses the sidecar's own table of refused characters (generated from it),
// not Go's Unicode tables, so it agrees with the server byte for byte.
//
// The sidecar stays the authority: Submit does not call Validate. Use it
// where a message is made (a producer), to refuse bad input before it
// reaches the broker. maxPayloadBytes is the sidecar's limit (0: the default).
func Validate(s Submission, maxPayloadBytes int) *Error {
	if maxPayloadBytes <= 0 {
		maxPayloadBytes = DefaultMaxPayloadBytes
	}
	if msg := validateAwardID(s.AwardID); msg != "" {
		return invalid(msg)
	}
	if msg := validateTimestamp(s.SubmissionTimestamp); msg != "" {
		return invalid(msg)
	}
	if s.AmountCents <= 0 {
		return invalid(fmt.Sprintf("amount_cents must be greater than 0, got %d", s.AmountCents))
	}
	if len(s.Payload) > maxPayloadBytes {
		return &Error{Code: codes.ResourceExhausted, Kind: KindResourceExhausted,
			Message: fmt.Sprintf("payload is %d bytes, the limit is %d bytes", len(s.Payload), maxPayloadBytes)}
	}
	if s.IdempotencyKey != "" {
		if msg := ValidateKey(s.IdempotencyKey); msg != "" {
			return invalid(msg)
		}
	}
	return nil
}

func invalid(msg string) *Error {
	return &Error{Code: codes.InvalidArgument, Kind: KindInvalidSubmission, Message: msg}
}

func validateAwardID(a string) string {
	if !utf8.ValidString(a) {
		return "award_id is not valid UTF-8"
	}
	n := utf8.RuneCountInString(a)
	switch {
	case n == 0:
		return "award_id is required"
	case n > MaxAwardIDChars:
		return fmt.Sprintf("award_id is %d characters, at most %d allowed", n, MaxAwardIDChars)
	case strings.ContainsRune(a, '|'):
		return "award_id must not contain '|'"
	}
	for _, r := range a {
		if why := RefusedAwardIDChar(r); why != "" {
			return fmt.Sprintf("award_id must be printable, found %s U+%04X", why, r)
		}
	}
	first, _ := utf8.DecodeRuneInString(a)
	last, _ := utf8.DecodeLastRuneInString(a)
	if isWhiteSpace(first) || isWhiteSpace(last) {
		return "award_id must not begin or end with white space"
	}
	return ""
}

// RefusedAwardIDChar is why an award id may not hold r, as the sidecar's
// message names it ("control character", "format character", ...), or ""
// when it may. The table is the sidecar's (its Unicode version: unicodeVersion).
func RefusedAwardIDChar(r rune) string {
	i := sort.Search(len(refusedRanges), func(i int) bool { return refusedRanges[i].last >= r })
	if i < len(refusedRanges) && refusedRanges[i].first <= r {
		return refusedReasons[refusedRanges[i].reason]
	}
	return ""
}

func isWhiteSpace(r rune) bool {
	for _, w := range whiteSpace {
		if w[0] <= r && r <= w[1] {
			return true
		}
	}
	return false
}

const timestampFormat = "submission_timestamp must be an RFC 3339 date-time (e.g. 2026-11-29T10:57:45Z)"

func validateTimestamp(ts string) string {
	switch {
	case !utf8.ValidString(ts):
		return "submission_timestamp is not valid UTF-8"
	case ts == "":
		return "submission_timestamp is required"
	case len(ts) > 64:
		return "submission_timestamp is longer than 64 bytes"
	}
	for _, r := range ts {
		if unicode.Is(unicode.Cc, r) {
			return fmt.Sprintf("submission_timestamp must not contain control characters, found U+%04X", r)
		}
	}
	if len(ts) > 10 && ts[10] != 'T' && ts[10] != 't' {
		return timestampFormat + ": date and time must be separated by 'T'"
	}
	if !isRFC3339DateTime(ts) {
		return timestampFormat
	}
	return ""
}

// isRFC3339DateTime is RFC 3339 §5.6 date-time, exactly: YYYY-MM-DD T|t
// hh:mm:ss [. digits] (Z|z|±hh:mm), real calendar dates, a leap second only
// at :59:60.
func isRFC3339DateTime(b string) bool {
	digits := func(from, to int) (int, bool) {
		if to > len(b) {
			return 0, false
		}
		n := 0
		for i := from; i < to; i++ {
			if b[i] < '0' || b[i] > '9' {
				return 0, false
			}
			n = n*10 + int(b[i]-'0')
		}
		return n, true
	}
	year, ok1 := digits(0, 4)
	month, ok2 := digits(5, 7)
	day, ok3 := digits(8, 10)
	hour, ok4 := digits(11, 13)
	minute, ok5 := digits(14, 16)
	second, ok6 := digits(17, 19)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return false
	}
	if b[4] != '-' || b[7] != '-' || (b[10] != 'T' && b[10] != 't') || b[13] != ':' || b[16] != ':' {
		return false
	}
	if !validDate(year, month, day) || hour > 23 || minute > 59 || second > 60 || (second == 60 && minute != 59) {
		return false
	}
	return validZone(b[19:])
}

func validDate(year, month, day int) bool {
	leap := year%4 == 0 && (year%100 != 0 || year%400 == 0)
	days := 0
	switch month {
	case 1, 3, 5, 7, 8, 10, 12:
		days = 31
	case 4, 6, 9, 11:
		days = 30
	case 2:
		days = 28
		if leap {
			days = 29
		}
	default:
		return false
	}
	return day >= 1 && day <= days
}

func validZone(rest string) bool {
	if strings.HasPrefix(rest, ".") {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 1 {
			return false
		}
		rest = rest[n:]
	}
	if rest == "Z" || rest == "z" {
		return true
	}
	if len(rest) != 6 || (rest[0] != '+' && rest[0] != '-') || rest[3] != ':' {
		return false
	}
	for _, i := range []int{1, 2, 4, 5} {
		if rest[i] < '0' || rest[i] > '9' {
			return false
		}
	}
	return (rest[1]-'0')*10+(rest[2]-'0') <= 23 && (rest[4]-'0')*10+(rest[5]-'0') <= 59
}

// ValidateKey checks a producer's idempotency key (or one given to Lookup)
// as the sidecar does; "" when it is valid, else the sidecar's message.
func ValidateKey(k string) string {
	if k == "" || len(k) > 128 {
		return "idempotency_key must be 1 to 128 characters when set"
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.:", c) >= 0) {
			return "idempotency_key may contain only ASCII letters, digits and - _ . :"
		}
	}
	return ""
}
