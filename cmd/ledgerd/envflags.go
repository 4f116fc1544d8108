package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"
)

// envFlags defines flags whose default is their environment variable when
// it is set. A value read as text is parsed by finish, so that a bad one,
// from the command line or the environment, is refused naming its flag.
type envFlags struct {
	fs      *flag.FlagSet
	pending []parsedFlag
	envErr  error // the first boolean variable that is not one
}

// parsedFlag is a flag read as text and the parser that stores it.
type parsedFlag struct {
	name  string
	value *string
	parse func(string) error // returns what a value must be ("want ...")
}

// text defines a string flag.
func (f *envFlags) text(dst *string, name, envName, def, usage string) {
	f.fs.StringVar(dst, name, env(envName, def), usage+" ["+envName+"]")
}

// parsed defines a flag read as text and stored by parse in finish.
func (f *envFlags) parsed(name, envName, def, usage string, parse func(string) error) {
	v := f.fs.String(name, env(envName, def), usage+" ["+envName+"]")
	f.pending = append(f.pending, parsedFlag{name, v, parse})
}

// boolean defines a boolean flag; a variable that is no boolean is refused
// by finish.
func (f *envFlags) boolean(dst *bool, name, envName string, def bool, usage string) {
	if v, ok := os.LookupEnv(envName); ok {
		b, err := strconv.ParseBool(v)
		if err != nil && f.envErr == nil {
			f.envErr = fmt.Errorf("%s=%q: want true or false", envName, v)
		}
		def = b
	}
	f.fs.BoolVar(dst, name, def, usage+" ["+envName+"]")
}

// finish parses the text flags in the order they were defined, and returns
// the first refusal.
func (f *envFlags) finish() error {
	if f.envErr != nil {
		return f.envErr
	}
	for _, p := range f.pending {
		if err := p.parse(*p.value); err != nil {
			return fmt.Errorf("--%s %q: %w", p.name, *p.value, err)
		}
	}
	return nil
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// Parsers for envFlags.parsed: each stores a valid value in dst and
// returns what a value must be otherwise.

// duration takes a positive duration.
func duration(dst *time.Duration, want string) func(string) error {
	return atLeast(dst, time.Nanosecond, want)
}

// atLeast takes a duration of at least min.
func atLeast(dst *time.Duration, min time.Duration, want string) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		switch {
		case err != nil || d <= 0:
			return fmt.Errorf("%s", want)
		case d < min:
			return fmt.Errorf("want at least %s", min)
		}
		*dst = d
		return nil
	}
}

// durationOrZero takes a duration of 0 or more.
func durationOrZero(dst *time.Duration, want string) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return fmt.Errorf("%s", want)
		}
		*dst = d
		return nil
	}
}

// orNever takes a positive duration, or 0 stored as -1 (never, in
// server.ConnectionLimits).
func orNever(dst *time.Duration) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		switch {
		case err == nil && d == 0:
			d = -1
		case err != nil || d < 0:
			return fmt.Errorf("want a positive duration like 30m, or 0 for never")
		}
		*dst = d
		return nil
	}
}

// count takes a whole number from 0 to max.
func count(dst *int, max int, want string) func(string) error {
	return func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > max {
			return fmt.Errorf("%s", want)
		}
		*dst = n
		return nil
	}
}

// limit takes a count, 0 stored as -1 (no bound, in
// server.ConnectionLimits).
func limit(dst *int) func(string) error {
	return func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("want a count, 0 for no limit")
		}
		if n == 0 {
			n = -1
		}
		*dst = n
		return nil
	}
}

// streams takes a count of streams from 1 to 2^32-1.
func streams(dst *uint32) func(string) error {
	return func(s string) error {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("want a count from 1 to %d", uint32(math.MaxUint32))
		}
		*dst = uint32(n)
		return nil
	}
}

// rate takes a finite number of calls per second, 0 or more.
func rate(dst *float64) func(string) error {
	return func(s string) error {
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || !(r >= 0) || math.IsInf(r, 0) {
			return fmt.Errorf("want a finite number of calls per second, 0 for no limit")
		}
		*dst = r
		return nil
	}
}
