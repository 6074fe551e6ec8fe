package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/internal/jsonscan"
)

// bodyReadTimeout bounds reading a request body.
const bodyReadTimeout = 60 * time.Second

// readBody reads a request body within the size limit; it returns nil
// for a body of whitespace only. json says whether a body with that
// Content-Type may be read as JSON.
func (s *Server) readBody(c echo.Context, json func(mediaType string) bool) ([]byte, error) {
	r := c.Request()
	// A body sent slowly gets no more time than a fast one would need.
	http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, newError(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "the request body is over the limit")
		}
		return nil, newError(http.StatusBadRequest, "BAD_REQUEST", "reading the request body: "+err.Error())
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	mt := ""
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err = mime.ParseMediaType(ct); err != nil {
			mt = "invalid"
		}
	}
	if !json(mt) {
		return nil, newError(http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE", "the body must be JSON: send Content-Type: application/json")
	}
	return body, nil
}

// isJSONType reports whether a media type names JSON.
func isJSONType(mt string) bool { return mt == "application/json" || strings.HasSuffix(mt, "+json") }

// readJSON decodes a body of the Jupyter surface into v; an empty body
// leaves v as is. It reads what Jupyter clients send: JSON with or without
// a Content-Type, as text/plain too (@jupyterlab/services posts JSON so,
// fetch's default), fields it does not know ignored. Form bodies, which a
// page of another origin can send, never pass.
func (s *Server) readJSON(c echo.Context, v any) error {
	body, err := s.readBody(c, func(mt string) bool { return mt == "" || mt == "text/plain" || isJSONType(mt) })
	if err != nil || body == nil {
		return err
	}
	return unmarshalBody(body, v)
}

// decodeBody decodes a body of the code-interpreter API into v, a pointer
// to a struct; an empty body leaves v as is. It is strict, so that a typo
// is an error rather than a run somewhere else: the body is JSON sent as
// such (Content-Type: application/json), an object whose member names
// match v's fields exactly, each once.
func (s *Server) decodeBody(c echo.Context, v any) error {
	body, err := s.readBody(c, isJSONType)
	if err != nil || body == nil {
		return err
	}
	known := fieldNames(reflect.TypeOf(v).Elem())
	var unknown []string
	// Names without escapes are checked as they are, without a map of
	// the members; encoding/json reads the others.
	if !jsonscan.Each(body, func(name, _ []byte) {
		if !contains(known, string(name)) {
			unknown = append(unknown, string(name))
		}
	}) {
		unknown = unknown[:0]
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil || members == nil {
			if err := unmarshalBody(body, new(any)); err != nil {
				return err
			}
			return newError(http.StatusBadRequest, "BAD_REQUEST", "the request body must be a JSON object")
		}
		for name := range members {
			if !contains(known, name) {
				unknown = append(unknown, name)
			}
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return newError(http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("unknown field %q: the fields are %s (names are case-sensitive)",
			unknown[0], strings.Join(known, ", ")))
	}
	return unmarshalBody(body, v)
}

// fieldNamesOf holds fieldNames's lists by type: bodies are decoded into
// a few types.
var fieldNamesOf sync.Map // reflect.Type → []string

// fieldNames lists the JSON names of a struct's fields. The caller must
// not change the list.
func fieldNames(t reflect.Type) []string {
	if names, ok := fieldNamesOf.Load(t); ok {
		return names.([]string)
	}
	names := structFieldNames(t)
	fieldNamesOf.Store(t, names)
	return names
}

func structFieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// unmarshalBody decodes JSON into v with errors a client can act on.
func unmarshalBody(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return newError(http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("field %s: want %s, not %s", typeErr.Field, jsonKind(typeErr.Type), typeErr.Value))
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return newError(http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("the request body is not valid JSON (at byte %d)", syntaxErr.Offset))
	}
	return newError(http.StatusBadRequest, "BAD_REQUEST", "the request body is not a valid JSON object")
}

// jsonKind names a Go type as a JSON kind, for error messages.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Float64, reflect.Float32, reflect.Uint64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another type"
}
