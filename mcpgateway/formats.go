package mcpgateway

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// clientFormats are the formats the official TypeScript client asserts
// (ajv-formats 3.0.1's full set, which its AjvJsonSchemaValidator adds),
// as that client checks them, so that an answer the gateway passes on is
// one the client takes. Where a check cannot be ported exactly it is
// stricter: url accepts no IP address as its host. regex is left to the
// validator, which lets no format replace it. A string format passes any
// value that is not a string; a number format, any that is not a number.
var clientFormats = []*jsonschema.Format{
	stringFormat("date", isDate),
	stringFormat("time", timeChecker(true)),
	stringFormat("date-time", dateTimeChecker(true)),
	stringFormat("iso-time", timeChecker(false)),
	stringFormat("iso-date-time", dateTimeChecker(false)),
	stringFormat("duration", isDuration),
	stringFormat("uri", func(s string) bool { return strings.ContainsAny(s, "/:") && uriRE.MatchString(s) }),
	stringFormat("uri-reference", uriReferenceRE.MatchString),
	stringFormat("uri-template", uriTemplateRE.MatchString),
	stringFormat("url", urlRE.MatchString),
	stringFormat("email", emailRE.MatchString),
	stringFormat("hostname", isHostname),
	stringFormat("ipv4", ipv4RE.MatchString),
	stringFormat("ipv6", ipv6RE.MatchString),
	stringFormat("uuid", uuidRE.MatchString),
	stringFormat("json-pointer", jsonPointerRE.MatchString),
	stringFormat("json-pointer-uri-fragment", jsonPointerFragmentRE.MatchString),
	stringFormat("relative-json-pointer", relativeJSONPointerRE.MatchString),
	stringFormat("byte", byteRE.MatchString),
	numberFormat("int32", func(f float64) bool { return f == math.Trunc(f) && f >= math.MinInt32 && f <= math.MaxInt32 }),
	numberFormat("int64", func(f float64) bool { return f == math.Trunc(f) && !math.IsInf(f, 0) }),
}

var errFormat = errors.New("not in the format the TypeScript client asserts")

// stringFormat is format name checked by ok on strings.
func stringFormat(name string, ok func(string) bool) *jsonschema.Format {
	return &jsonschema.Format{Name: name, Validate: func(v any) error {
		if s, isString := v.(string); isString && !ok(s) {
			return errFormat
		}
		return nil
	}}
}

// numberFormat is format name checked by ok on numbers.
func numberFormat(name string, ok func(float64) bool) *jsonschema.Format {
	return &jsonschema.Format{Name: name, Validate: func(v any) error {
		if f, isNumber := number(v); isNumber && !ok(f) {
			return errFormat
		}
		return nil
	}}
}

// number returns v as a double, and whether it is a number a double holds.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f, err == nil
	}
	return 0, false
}

// jsSpace is what \s matches in JavaScript: Go's \s is ASCII only.
const jsSpace = `\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}`

// The client's expressions, case-insensitive ones written with both cases:
// Go's (?i) also matches ſ and K (the Kelvin sign) for s and k, which
// JavaScript's i flag does not.
var (
	dateRE         = regexp.MustCompile(`^(\d\d\d\d)-(\d\d)-(\d\d)$`)
	timeRE         = regexp.MustCompile(`^(\d\d):(\d\d):(\d\d(?:\.\d+)?)([zZ]|([+-])(\d\d)(?::?(\d\d))?)?$`)
	durationRE     = regexp.MustCompile(`^P((\d+Y)?(\d+M)?(\d+D)?(T(\d+H)?(\d+M)?(\d+S)?)?|(\d+W)?)$`)
	uriRE          = regexp.MustCompile(`^(?:[a-zA-Z][a-zA-Z0-9+\-.]*:)(?:\/?\/(?:(?:[a-zA-Z0-9\-._~!$&'()*+,;=:]|%[0-9a-fA-F]{2})*@)?(?:\[(?:(?:(?:(?:[0-9a-fA-F]{1,4}:){6}|::(?:[0-9a-fA-F]{1,4}:){5}|(?:[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){4}|(?:(?:[0-9a-fA-F]{1,4}:){0,1}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){3}|(?:(?:[0-9a-fA-F]{1,4}:){0,2}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){2}|(?:(?:[0-9a-fA-F]{1,4}:){0,3}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}:|(?:(?:[0-9a-fA-F]{1,4}:){0,4}[0-9a-fA-F]{1,4})?::)(?:[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?))|(?:(?:[0-9a-fA-F]{1,4}:){0,5}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}|(?:(?:[0-9a-fA-F]{1,4}:){0,6}[0-9a-fA-F]{1,4})?::)|[Vv][0-9a-fA-F]+\.[a-zA-Z0-9\-._~!$&'()*+,;=:]+)\]|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?)|(?:[a-zA-Z0-9\-._~!$&'()*+,;=]|%[0-9a-fA-F]{2})*)(?::\d*)?(?:\/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*|\/(?:(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?|(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*)(?:\?(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?(?:#(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?$`)
	uriReferenceRE = regexp.MustCompile(`^(?:[a-zA-Z][a-zA-Z0-9+\-.]*:)?(?:\/?\/(?:(?:[a-zA-Z0-9\-._~!$&'()*+,;=:]|%[0-9a-fA-F]{2})*@)?(?:\[(?:(?:(?:(?:[0-9a-fA-F]{1,4}:){6}|::(?:[0-9a-fA-F]{1,4}:){5}|(?:[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){4}|(?:(?:[0-9a-fA-F]{1,4}:){0,1}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){3}|(?:(?:[0-9a-fA-F]{1,4}:){0,2}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){2}|(?:(?:[0-9a-fA-F]{1,4}:){0,3}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}:|(?:(?:[0-9a-fA-F]{1,4}:){0,4}[0-9a-fA-F]{1,4})?::)(?:[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?))|(?:(?:[0-9a-fA-F]{1,4}:){0,5}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}|(?:(?:[0-9a-fA-F]{1,4}:){0,6}[0-9a-fA-F]{1,4})?::)|[Vv][0-9a-fA-F]+\.[a-zA-Z0-9\-._~!$&'()*+,;=:]+)\]|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?)|(?:[a-zA-Z0-9\-._~!$&'"()*+,;=]|%[0-9a-fA-F]{2})*)(?::\d*)?(?:\/(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})*)*|\/(?:(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?|(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?(?:\?(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?(?:#(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?$`)
	uriTemplateRE  = regexp.MustCompile(`^(?:(?:[^\x00-\x20"'<>%\\^` + "`" + `{|}]|%[0-9a-fA-F]{2})|\{[+#./;?&=,!@|]?(?:[a-zA-Z0-9_]|%[0-9a-fA-F]{2})+(?::[1-9][0-9]{0,3}|\*)?(?:,(?:[a-zA-Z0-9_]|%[0-9a-fA-F]{2})+(?::[1-9][0-9]{0,3}|\*)?)*\})*$`)
	// urlRE is the client's url without its IP address hosts, whose
	// ranges it checks by lookaheads Go's expressions do not have.
	urlRE                 = regexp.MustCompile(`(?i)^(?:https?|ftp)://(?:[^` + jsSpace + `]+(?::[^` + jsSpace + `]*)?@)?(?:(?:[a-z0-9\x{a1}-\x{ffff}]+-)*[a-z0-9\x{a1}-\x{ffff}]+)(?:\.(?:[a-z0-9\x{a1}-\x{ffff}]+-)*[a-z0-9\x{a1}-\x{ffff}]+)*(?:\.(?:[a-z\x{a1}-\x{ffff}]{2,}))(?::\d{2,5})?(?:/[^` + jsSpace + `]*)?$`)
	emailRE               = regexp.MustCompile("^[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?\\.)+[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?$")
	hostnameRE            = regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[-0-9a-zA-Z]{0,61}[0-9a-zA-Z])?)*\.?$`)
	ipv4RE                = regexp.MustCompile(`^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$`)
	ipv6RE                = regexp.MustCompile(`^((([0-9a-fA-F]{1,4}:){7}([0-9a-fA-F]{1,4}|:))|(([0-9a-fA-F]{1,4}:){6}(:[0-9a-fA-F]{1,4}|((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})|:))|(([0-9a-fA-F]{1,4}:){5}(((:[0-9a-fA-F]{1,4}){1,2})|:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})|:))|(([0-9a-fA-F]{1,4}:){4}(((:[0-9a-fA-F]{1,4}){1,3})|((:[0-9a-fA-F]{1,4})?:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(([0-9a-fA-F]{1,4}:){3}(((:[0-9a-fA-F]{1,4}){1,4})|((:[0-9a-fA-F]{1,4}){0,2}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(([0-9a-fA-F]{1,4}:){2}(((:[0-9a-fA-F]{1,4}){1,5})|((:[0-9a-fA-F]{1,4}){0,3}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(([0-9a-fA-F]{1,4}:){1}(((:[0-9a-fA-F]{1,4}){1,6})|((:[0-9a-fA-F]{1,4}){0,4}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(:(((:[0-9a-fA-F]{1,4}){1,7})|((:[0-9a-fA-F]{1,4}){0,5}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:)))$`)
	uuidRE                = regexp.MustCompile(`^(?:[uU][rR][nN]:[uU][uU][iI][dD]:)?[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$`)
	jsonPointerRE         = regexp.MustCompile(`^(?:/(?:[^~/]|~0|~1)*)*$`)
	jsonPointerFragmentRE = regexp.MustCompile(`^#(?:/(?:[a-zA-Z0-9_\-.!$&'()*+,;:=@]|%[0-9a-fA-F]{2}|~0|~1)*)*$`)
	relativeJSONPointerRE = regexp.MustCompile(`^(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~0|~1)*)*)$`)
	// byteRE is multiline, as the client's: one line of base64 is enough.
	byteRE = regexp.MustCompile(`(?m)^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$`)
)

// isDate reports whether s is a full-date of RFC 3339.
func isDate(s string) bool {
	m := dateRE.FindStringSubmatch(s)
	if m == nil {
		return false
	}
	year, _ := strconv.Atoi(m[1])
	month, _ := strconv.Atoi(m[2])
	day, _ := strconv.Atoi(m[3])
	days := [...]int{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	if month == 2 && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		days[2] = 29
	}
	return month >= 1 && month <= 12 && day >= 1 && day <= days[month]
}

// timeChecker checks a time as the client does: a zone required when
// strict, a leap second only at 23:59 UTC.
func timeChecker(strict bool) func(string) bool {
	return func(s string) bool {
		m := timeRE.FindStringSubmatch(s)
		if m == nil {
			return false
		}
		hr, _ := strconv.Atoi(m[1])
		min, _ := strconv.Atoi(m[2])
		sec, _ := strconv.ParseFloat(m[3], 64)
		sign, tzH, tzM := 1, 0, 0
		if m[5] == "-" {
			sign = -1
		}
		if m[6] != "" {
			tzH, _ = strconv.Atoi(m[6])
		}
		if m[7] != "" {
			tzM, _ = strconv.Atoi(m[7])
		}
		if tzH > 23 || tzM > 59 || strict && m[4] == "" {
			return false
		}
		if hr <= 23 && min <= 59 && sec < 60 {
			return true
		}
		utcMin := min - tzM*sign
		utcHr := hr - tzH*sign
		if utcMin < 0 {
			utcHr--
		}
		return (utcHr == 23 || utcHr == -1) && (utcMin == 59 || utcMin == -1) && sec < 61
	}
}

// dateTimeSeparator is where the client splits a date-time: t, T or any
// whitespace.
var dateTimeSeparator = regexp.MustCompile(`[tT` + jsSpace + `]`)

// dateTimeChecker checks a date-time as the client does.
func dateTimeChecker(strict bool) func(string) bool {
	isTime := timeChecker(strict)
	return func(s string) bool {
		parts := dateTimeSeparator.Split(s, -1)
		return len(parts) == 2 && isDate(parts[0]) && isTime(parts[1])
	}
}

// isDuration is the client's duration: at least one part, and a digit
// after a T.
func isDuration(s string) bool {
	if s == "P" || !durationRE.MatchString(s) {
		return false
	}
	i := strings.IndexByte(s, 'T')
	return i < 0 || i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9'
}

// isHostname is the client's hostname: at most 253 characters before an
// optional final dot.
func isHostname(s string) bool {
	n := len(strings.TrimSuffix(s, "."))
	return n >= 1 && n <= 253 && hostnameRE.MatchString(s)
}

// clientMultipleOf checks multipleOf as the TypeScript client's AJV does,
// beside the validator's exact check: it divides in floating point and
// takes a quotient that is an integer below 1e21. So 0.07 is not a
// multiple of 0.01 there (0.07 / 0.01 is 7.000000000000001), nor is 0.3
// one of 0.1: 1,363 of the 10,000 amounts 0.00 to 99.99 fail a price's
// multipleOf 0.01 in the client.
var clientMultipleOf = func() *jsonschema.Vocabulary {
	meta, err := jsonschema.UnmarshalJSON(strings.NewReader(`{}`))
	if err != nil {
		panic(err)
	}
	c := jsonschema.NewCompiler()
	const url = "urn:opledger:client-multiple-of"
	if err := c.AddResource(url, meta); err != nil {
		panic(err)
	}
	return &jsonschema.Vocabulary{URL: url, Schema: c.MustCompile(url), Compile: compileMultipleOf}
}()

// compileMultipleOf returns the client's multipleOf check of obj, if it
// has a numeric one.
func compileMultipleOf(_ *jsonschema.CompilerContext, obj map[string]any) (jsonschema.SchemaExt, error) {
	n, ok := obj["multipleOf"].(json.Number)
	if !ok {
		return nil, nil
	}
	m, err := n.Float64()
	if err != nil || m <= 0 {
		return nil, nil // the validator refuses the schema
	}
	return multipleOf(m), nil
}

// multipleOf is the client's multipleOf check.
type multipleOf float64

// Validate reports a number whose quotient by m, in floating point, is not
// an integer below 1e21.
func (m multipleOf) Validate(ctx *jsonschema.ValidatorContext, v any) {
	x, ok := number(v)
	if !ok {
		return
	}
	if q := x / float64(m); q != math.Trunc(q) || math.Abs(q) >= 1e21 {
		got, _ := new(big.Rat).SetString(strconv.FormatFloat(x, 'g', -1, 64))
		ctx.AddError(&kind.MultipleOf{Got: got, Want: new(big.Rat).SetFloat64(float64(m))})
	}
}
