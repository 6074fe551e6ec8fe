// Package kernelspecs finds, parses and validates Jupyter kernelspecs
// (kernel.json) on the Jupyter search path.
//
// A kernelspec is a directory whose base name is the kernel name and which
// holds kernel.json plus optional resources (logos, kernel.js, kernel.css).
// The package knows nothing of processes, ZeroMQ or HTTP: it hands out
// validated [Spec] values, the command line to run and files to serve.
package kernelspecs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// InterruptMode says how a kernel is interrupted.
type InterruptMode string

const (
	InterruptSignal  InterruptMode = "signal"  // SIGINT to the process group (default when absent)
	InterruptMessage InterruptMode = "message" // interrupt_request on the control channel
)

var (
	// ErrNoSuchSpec means no kernelspec of that name was found.
	ErrNoSuchSpec = errors.New("kernelspecs: no such kernelspec")
	// ErrInvalid means a kernel.json or a kernelspec name failed validation.
	ErrInvalid = errors.New("kernelspecs: invalid kernelspec")
)

const (
	specFile    = "kernel.json"
	maxSpecSize = 1 << 20 // bytes of kernel.json read before giving up
)

// Spec is one validated kernelspec.
//
// Specs from [Parse] and [Catalog] may be shared between callers; treat
// them as read-only.
type Spec struct {
	Name            string            // directory name, matching ^[a-z0-9._-]+$
	Dir             string            // absolute path of the directory holding kernel.json (the resource dir)
	Argv            []string          // non-empty; Argv[0] non-empty
	DisplayName     string            // json "display_name"
	Language        string            // json "language"
	InterruptMode   InterruptMode     // InterruptSignal when absent
	Env             map[string]string // nil when absent
	Metadata        map[string]any    // as parsed JSON; nil when absent
	ProtocolVersion string            // json "kernel_protocol_version"; may be empty
	Resources       map[string]string // resource key → file name directly in Dir; never nil
}

// Parse reads dir/kernel.json and validates it; the name is the base name
// of dir. A missing kernel.json wraps both ErrNoSuchSpec and
// fs.ErrNotExist; anything else wrong with the spec wraps ErrInvalid.
func Parse(dir string) (*Spec, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("kernelspecs: %w", err)
	}
	name := filepath.Base(abs)
	if err := checkName(name); err != nil {
		return nil, err
	}
	data, err := readSpecFile(name, filepath.Join(abs, specFile))
	if err != nil {
		return nil, err
	}
	s, err := decode(name, data)
	if err != nil {
		return nil, err
	}
	s.Dir = abs
	s.Resources = listResources(s)
	return s, nil
}

// checkName reports whether name is a valid kernelspec name: lowercase
// ASCII letters, digits, '.', '_' and '-', and not "." or "..".
func checkName(name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: bad name %q", ErrInvalid, name)
	}
	for _, r := range name {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9', r == '.', r == '_', r == '-':
		default:
			return fmt.Errorf("%w: bad name %q: only a-z, 0-9, '.', '_' and '-' are allowed", ErrInvalid, name)
		}
	}
	return nil
}

func readSpecFile(name, path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w %q: %w", ErrNoSuchSpec, name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalid, name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalid, name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w %q: %s is not a regular file", ErrInvalid, name, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSpecSize+1))
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalid, name, err)
	}
	if len(data) > maxSpecSize {
		return nil, fmt.Errorf("%w %q: %s is larger than %d bytes", ErrInvalid, name, path, maxSpecSize)
	}
	return data, nil
}

// decode validates the kernel.json document data. Unknown fields are
// ignored; a field set to null counts as absent.
func decode(name string, data []byte) (*Spec, error) {
	invalid := func(field, format string, args ...any) error {
		return fmt.Errorf("%w %q: %s: %s", ErrInvalid, name, field, fmt.Sprintf(format, args...))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalid, name, err)
	}
	if fields == nil {
		return nil, fmt.Errorf("%w %q: kernel.json is not a JSON object", ErrInvalid, name)
	}
	s := &Spec{Name: name}

	raw, ok := field(fields, "argv")
	if !ok {
		return nil, invalid("argv", "missing")
	}
	var argv []json.RawMessage
	if err := json.Unmarshal(raw, &argv); err != nil {
		return nil, invalid("argv", "not an array")
	}
	if len(argv) == 0 {
		return nil, invalid("argv", "empty")
	}
	s.Argv = make([]string, len(argv))
	for i, r := range argv {
		v, ok := jsonString(r)
		switch {
		case !ok:
			return nil, invalid(fmt.Sprintf("argv[%d]", i), "not a string")
		case strings.ContainsRune(v, 0):
			return nil, invalid(fmt.Sprintf("argv[%d]", i), "contains NUL")
		}
		s.Argv[i] = v
	}
	if s.Argv[0] == "" {
		return nil, invalid("argv[0]", "empty")
	}

	for _, f := range []struct {
		key string
		dst *string
	}{{"display_name", &s.DisplayName}, {"language", &s.Language}} {
		raw, ok := field(fields, f.key)
		if !ok {
			return nil, invalid(f.key, "missing")
		}
		v, ok := jsonString(raw)
		if !ok {
			return nil, invalid(f.key, "not a string")
		}
		if strings.TrimSpace(v) == "" {
			return nil, invalid(f.key, "empty")
		}
		*f.dst = v
	}

	s.InterruptMode = InterruptSignal
	if raw, ok := field(fields, "interrupt_mode"); ok {
		v, ok := jsonString(raw)
		if !ok {
			return nil, invalid("interrupt_mode", "not a string")
		}
		switch m := InterruptMode(v); m {
		case "":
		case InterruptSignal, InterruptMessage:
			s.InterruptMode = m
		default:
			return nil, invalid("interrupt_mode", "%q is not %q or %q", v, InterruptSignal, InterruptMessage)
		}
	}

	if raw, ok := field(fields, "env"); ok {
		var env map[string]json.RawMessage
		if err := json.Unmarshal(raw, &env); err != nil {
			return nil, invalid("env", "not an object")
		}
		s.Env = make(map[string]string, len(env))
		for _, k := range slices.Sorted(maps.Keys(env)) {
			v, ok := jsonString(env[k])
			switch {
			case k == "" || strings.ContainsAny(k, "=\x00"):
				return nil, invalid("env", "bad variable name %q", k)
			case !ok:
				return nil, invalid("env", "value of %s is not a string", k)
			case strings.ContainsRune(v, 0):
				return nil, invalid("env", "value of %s contains NUL", k)
			}
			s.Env[k] = v
		}
	}

	if raw, ok := field(fields, "metadata"); ok {
		if err := json.Unmarshal(raw, &s.Metadata); err != nil {
			return nil, invalid("metadata", "not an object")
		}
	}

	if raw, ok := field(fields, "kernel_protocol_version"); ok {
		v, ok := jsonString(raw)
		if !ok {
			return nil, invalid("kernel_protocol_version", "not a string")
		}
		s.ProtocolVersion = v
	}
	return s, nil
}

// field returns fields[key] unless it is absent or null.
func field(fields map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	raw, ok := fields[key]
	if !ok || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

// jsonString decodes raw if it is a JSON string.
func jsonString(raw json.RawMessage) (string, bool) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

// Command returns the command line and environment to start the kernel.
//
// In argv, {connection_file} becomes connFile and {resource_dir} becomes
// s.Dir; other {placeholders} are left as they are. In env values, $VAR and
// ${VAR} are replaced with lookup(VAR), or "" when lookup reports it unset
// (lookup may be nil); "$$" is a literal "$" and a "$" not followed by a
// name is kept, as in Python's string.Template. The results are fresh
// copies: s is never mutated, and env is never nil.
func (s *Spec) Command(connFile string, lookup func(string) (string, bool)) (argv []string, env map[string]string) {
	r := strings.NewReplacer("{connection_file}", connFile, "{resource_dir}", s.Dir)
	argv = make([]string, len(s.Argv))
	for i, a := range s.Argv {
		argv[i] = r.Replace(a)
	}
	env = make(map[string]string, len(s.Env))
	for k, v := range s.Env {
		env[k] = expand(v, lookup)
	}
	return argv, env
}

// expand replaces $NAME and ${NAME} in v, where NAME is [A-Za-z_][A-Za-z0-9_]*.
func expand(v string, lookup func(string) (string, bool)) string {
	if !strings.Contains(v, "$") {
		return v
	}
	get := func(name string) string {
		if lookup == nil {
			return ""
		}
		val, _ := lookup(name)
		return val
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(v, '$')
		if i < 0 {
			b.WriteString(v)
			return b.String()
		}
		b.WriteString(v[:i])
		rest := v[i+1:]
		switch {
		case strings.HasPrefix(rest, "$"):
			b.WriteByte('$')
			v = rest[1:]
		case strings.HasPrefix(rest, "{"):
			end := strings.IndexByte(rest, '}')
			if end < 0 || nameLen(rest[1:end]) != end-1 || end == 1 {
				b.WriteByte('$')
				v = rest
				break
			}
			b.WriteString(get(rest[1:end]))
			v = rest[end+1:]
		default:
			n := nameLen(rest)
			if n == 0 {
				b.WriteByte('$')
				v = rest
				break
			}
			b.WriteString(get(rest[:n]))
			v = rest[n:]
		}
	}
}

// nameLen returns the length of the variable name at the start of s.
func nameLen(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return i
		}
	}
	return len(s)
}
