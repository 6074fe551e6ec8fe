package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

func (h *Handler) addFileTools(srv *sdk.Server) {
	addTool(h, srv, &sdk.Tool{
		Name:  "write_file",
		Title: "Write a file",
		Description: `Write a file into a context's workspace, the kernel's working directory: code run in that context opens it by its relative path (open("data.csv")). Folders above it are made; an existing file is replaced atomically.
path is relative to the workspace ("data/input.csv"); absolute paths and ".." are refused. Give content for text, or contentBase64 for binary data.`,
		InputSchema: inputSchema[writeArgs](nil),
		Annotations: &sdk.ToolAnnotations{Title: "Write a file", DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, h.writeFile)
	addTool(h, srv, &sdk.Tool{
		Name:        "read_file",
		Title:       "Read a file",
		Description: fmt.Sprintf(`Read a file of a context's workspace (for example one the code wrote: a CSV, a saved plot). Text comes back as text, PNG, JPEG, GIF and WebP images as images, other binary data as base64. Files over %d bytes are refused: download them from the files API, or read a part of them with run_code. Many large reads at once wait their turn.`, h.cfg.MaxReadBytes),
		InputSchema: inputSchema[pathArgs](nil),
		Annotations: &sdk.ToolAnnotations{Title: "Read a file", ReadOnlyHint: true, OpenWorldHint: boolPtr(false)},
	}, h.readFile)
	addTool(h, srv, &sdk.Tool{
		Name:        "list_files",
		Title:       "List files",
		Description: `List a folder of a context's workspace (the workspace itself when path is omitted): name, path, type (file, dir, symlink, fifo, socket, device or other; only files can be read), size and modification time of each entry.`,
		InputSchema: inputSchema[folderArgs](nil),
		Annotations: &sdk.ToolAnnotations{Title: "List files", ReadOnlyHint: true, OpenWorldHint: boolPtr(false)},
	}, h.listFiles)
}

// writeArgs are write_file's arguments.
type writeArgs struct {
	Context       string  `json:"context" jsonschema:"The context's id."`
	Path          string  `json:"path" jsonschema:"Path relative to the context's workspace."`
	Content       *string `json:"content,omitempty" jsonschema:"The file's text (UTF-8)."`
	ContentBase64 *string `json:"contentBase64,omitempty" jsonschema:"The file's bytes, base64-encoded; instead of content."`
}

// pathArgs are read_file's arguments.
type pathArgs struct {
	Context string `json:"context" jsonschema:"The context's id."`
	Path    string `json:"path" jsonschema:"Path relative to the context's workspace."`
}

// folderArgs are list_files's arguments.
type folderArgs struct {
	Context string `json:"context" jsonschema:"The context's id."`
	Path    string `json:"path,omitempty" jsonschema:"A folder relative to the workspace; omitted: the workspace."`
}

func (h *Handler) writeFile(ctx context.Context, a Access, args writeArgs) (*sdk.CallToolResult, error) {
	if err := h.check(a, true, args.Context); err != nil {
		return nil, err
	}
	var data []byte
	switch {
	case args.Content != nil && args.ContentBase64 != nil:
		return nil, &badArgs{"give content or contentBase64, not both"}
	case args.Content != nil:
		data = []byte(*args.Content)
	case args.ContentBase64 != nil:
		var err error
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(*args.ContentBase64)); err != nil {
			return nil, &badArgs{"contentBase64 is not base64: " + err.Error()}
		}
	default:
		return nil, &badArgs{"content or contentBase64 is required"}
	}
	fi, err := h.cfg.Files.Write(ctx, args.Context, args.Path, bytesReader(data))
	if err != nil {
		return nil, err
	}
	return jsonResult(fmt.Sprintf("Wrote %s (%d bytes) in context %s.", fi.Path, fi.Size, args.Context), fi)
}

func (h *Handler) readFile(ctx context.Context, a Access, args pathArgs) (*sdk.CallToolResult, error) {
	if err := h.check(a, false, args.Context); err != nil {
		return nil, err
	}
	file, fi, err := h.cfg.Files.Open(ctx, args.Context, args.Path, h.cfg.MaxReadBytes)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	// The call waits for as much of the budget as its answer will hold,
	// counted from the file before the answer is made.
	bound, err := answerBound(file, fi.Path, fi.Size)
	if err == nil {
		_, err = file.Seek(0, io.SeekStart)
	}
	if err != nil {
		return nil, err
	}
	done, err := h.reads.take(ctx, bound)
	if err != nil {
		return nil, err
	}
	defer done()
	c, meta, err := readContent(file, fi.Path, fi.Size, bound)
	if err != nil {
		return nil, err
	}
	return &sdk.CallToolResult{Content: []sdk.Content{c}, StructuredContent: meta}, nil
}

func (h *Handler) listFiles(ctx context.Context, a Access, args folderArgs) (*sdk.CallToolResult, error) {
	if err := h.check(a, false, args.Context); err != nil {
		return nil, err
	}
	entries, err := h.cfg.Files.List(ctx, args.Context, args.Path)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	if len(entries) == 0 {
		b.WriteString("(empty)")
	}
	for _, e := range entries {
		if e.Type == "dir" {
			fmt.Fprintf(&b, "%s/\n", e.Path)
			continue
		}
		fmt.Fprintf(&b, "%s\t%d bytes\n", e.Path, e.Size)
	}
	if entries == nil {
		entries = []FileInfo{}
	}
	return jsonResult(strings.TrimRight(b.String(), "\n"), map[string]any{"files": entries})
}
