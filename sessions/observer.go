package sessions

import (
	"sort"
	"time"

	"kernelgate/provision/local"
	"kernelgate/runs"
)

// Observer is told what the manager does, for metrics. Its methods are
// called from the manager's goroutines and must not block.
type Observer interface {
	KernelStarted(spec string, took time.Duration, err error)
	// KernelRestarted: cause is "died" (automatic) or "requested".
	KernelRestarted(spec, cause string)
	KernelDied(spec string)
	KernelCulled(spec string)
	PoolTaken(spec string, hit bool)
	runs.Observer
}

type nopObserver struct{}

func (nopObserver) KernelStarted(string, time.Duration, error)        {}
func (nopObserver) KernelRestarted(string, string)                    {}
func (nopObserver) KernelDied(string)                                 {}
func (nopObserver) KernelCulled(string)                               {}
func (nopObserver) PoolTaken(string, bool)                            {}
func (nopObserver) RunEnded(string, runs.Reason, time.Duration, bool) {}

var _ Observer = nopObserver{}

// KernelCount is how many kernels of a kernelspec are in a state.
type KernelCount struct {
	Spec  string
	State string
	N     int
}

// KernelCounts counts the kernels by kernelspec and state.
func (m *Manager) KernelCounts() []KernelCount {
	counts := map[[2]string]int{}
	for _, k := range m.Kernels() {
		k.mu.Lock()
		state := k.state
		k.mu.Unlock()
		counts[[2]string{k.spec.Name, string(state)}]++
	}
	out := make([]KernelCount, 0, len(counts))
	for key, n := range counts {
		out = append(out, KernelCount{Spec: key[0], State: key[1], N: n})
	}
	return out
}

// QueuedRuns counts the runs waiting in the contexts' queues.
func (m *Manager) QueuedRuns() int {
	n := 0
	for _, c := range m.Contexts() {
		n += c.runs.Len()
	}
	return n
}

// Ready says whether kernels can be started: the default kernelspec and
// those of the code-interpreter languages exist (the optional languages'
// only where installed) and their program is an executable file. It
// returns the problems otherwise.
func (cat *Catalog) Ready() []string {
	var problems []string
	if len(cat.specs.Names()) == 0 {
		return []string{"no kernelspecs found"}
	}
	check := func(what, name string) {
		s, err := cat.specs.Get(name)
		if err != nil {
			problems = append(problems, what+": no kernelspec "+name)
			return
		}
		if err := local.CheckArgv(s); err != nil {
			problems = append(problems, what+": "+err.Error())
		}
	}
	check("default kernel", cat.cfg.DefaultKernel)
	langs := make([]string, 0, len(cat.cfg.Languages))
	for lang := range cat.cfg.Languages {
		langs = append(langs, lang)
	}
	sort.Strings(langs)
	for _, lang := range langs {
		name := cat.cfg.Languages[lang]
		if _, err := cat.specs.Get(name); err != nil && contains(cat.cfg.OptionalLanguages, lang) {
			continue
		}
		check("language "+lang, name)
	}
	return problems
}
