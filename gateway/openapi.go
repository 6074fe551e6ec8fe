package gateway

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/labstack/echo/v4"
)

// openapiYAML is the OpenAPI description of every route: hand-written, the
// source of truth; openapi_test.go keeps it and routes() in step.
//
//go:embed openapi.yaml
var openapiYAML []byte

// openAPIDoc is the embedded document, loaded and validated once.
var openAPIDoc = sync.OnceValues(func() (*openapi3.T, error) {
	return loadOpenAPI(openapiYAML)
})

// loadOpenAPI parses and validates an OpenAPI document.
func loadOpenAPI(data []byte) (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("gateway: loading openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("gateway: openapi.yaml is invalid: %w", err)
	}
	return doc, nil
}

// openAPIJSON caches the document as JSON by base URL.
var openAPIJSON sync.Map // base URL → []byte

// openAPIFor returns the document as JSON, its servers set to base.
func openAPIFor(base string) ([]byte, error) {
	if js, ok := openAPIJSON.Load(base); ok {
		return js.([]byte), nil
	}
	doc, err := openAPIDoc()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	if base != "/" {
		// Rewrite servers on a copy: the loaded document is shared.
		var m map[string]json.RawMessage
		if err := json.Unmarshal(js, &m); err != nil {
			return nil, err
		}
		m["servers"], _ = json.Marshal([]map[string]string{{
			"url":         strings.TrimSuffix(base, "/"),
			"description": "The gateway's base URL.",
		}})
		if js, err = json.Marshal(m); err != nil {
			return nil, err
		}
	}
	openAPIJSON.Store(base, js)
	return js, nil
}

// getOpenAPI serves the OpenAPI description of the API as JSON.
func (s *Server) getOpenAPI(c echo.Context) error {
	js, err := openAPIFor(s.cfg.BaseURL)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, js)
}
