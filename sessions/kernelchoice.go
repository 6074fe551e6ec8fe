package sessions

import (
	"fmt"
	"strings"

	"kernelgate/kernelspecs"
)

// A request of the code-interpreter API names a language, a kernelspec,
// both or neither. This file turns that into the kernelspec its kernel
// starts from, the language its runs report, and the id of its shared
// context.

// kernelChoice is what a request's language and kernelspec resolve to.
type kernelChoice struct {
	language string
	spec     *kernelspecs.Spec
	// shared is the id of the shared context of this choice: code-<language>
	// for a language of the table (also when named by its kernelspec), else
	// kernelspec-<name>.
	shared string
}

// sharedSpecPrefix begins the id of the shared context of a kernelspec
// that no language of the table names.
const sharedSpecPrefix = "kernelspec-"

// chooseKernel resolves a request's language and kernelspec:
//   - neither: the default language;
//   - a language: its kernelspec in the table;
//   - a kernelspec: that kernelspec, reported as the language of the table
//     that names it (its own language first: deno is typescript), else as
//     its own language, lower-cased;
//   - both: the kernelspec, which must be the language's in the table or
//     of that language.
func (cat *Catalog) chooseKernel(language, kernelspec string) (kernelChoice, error) {
	if kernelspec == "" {
		lang, spec, err := cat.requestSpec(language)
		if err != nil {
			return kernelChoice{}, err
		}
		return kernelChoice{language: lang, spec: spec, shared: sharedID(lang)}, nil
	}
	spec, err := cat.specs.Get(kernelspec)
	if err != nil {
		return kernelChoice{}, errorf(ErrInvalidLanguage, "kernelspec %q is not installed; installed: %s", kernelspec, strings.Join(cat.specs.Names(), ", "))
	}
	own := specLanguage(spec)
	if language != "" {
		if cat.cfg.Languages[language] == spec.Name {
			return kernelChoice{language: language, spec: spec, shared: sharedID(language)}, nil
		}
		if !strings.EqualFold(language, own) {
			return kernelChoice{}, errorf(ErrBadRequest, "kernelspec %s runs %s, not %s: omit language, or name both as GET /api/languages lists them", spec.Name, own, language)
		}
		return kernelChoice{language: own, spec: spec, shared: sharedSpecPrefix + spec.Name}, nil
	}
	if lang := cat.tableLanguage(spec.Name, own); lang != "" {
		return kernelChoice{language: lang, spec: spec, shared: sharedID(lang)}, nil
	}
	return kernelChoice{language: own, spec: spec, shared: sharedSpecPrefix + spec.Name}, nil
}

// specLanguage is the language a kernelspec says it runs, lower-cased
// (IRkernel says "R"); its name when it says none.
func specLanguage(spec *kernelspecs.Spec) string {
	if spec.Language == "" {
		return spec.Name
	}
	return strings.ToLower(spec.Language)
}

// tableLanguage returns the language of the table whose kernelspec is
// name: own when it is one of them, else the first in order; "" when none.
func (cat *Catalog) tableLanguage(name, own string) string {
	if cat.cfg.Languages[own] == name {
		return own
	}
	first := ""
	for lang, spec := range cat.cfg.Languages {
		if spec == name && (first == "" || lang < first) {
			first = lang
		}
	}
	return first
}

// contextSpec returns the kernelspec of a kept context: the one it was
// made with when it names one, else its language's.
func (cat *Catalog) contextSpec(language, kernelspec string) (*kernelspecs.Spec, error) {
	if kernelspec == "" {
		return cat.languageSpec(language)
	}
	spec, err := cat.specs.Get(kernelspec)
	if err != nil {
		return nil, fmt.Errorf("%w: kernelspec %s is not installed", ErrInvalidLanguage, kernelspec)
	}
	return spec, nil
}

// displayResults says whether a kernel of spec shows the values of its
// code with display_data rather than execute_result (IRkernel does), so
// that those displays are a run's main results:
// metadata.kernelgate.display_results when the kernelspec sets it, else
// true for kernels of R.
func displayResults(spec *kernelspecs.Spec) bool {
	if spec == nil {
		return false
	}
	md, _ := spec.Metadata["kernelgate"].(map[string]any)
	if v, ok := md["display_results"].(bool); ok {
		return v
	}
	return strings.EqualFold(spec.Language, "r")
}
