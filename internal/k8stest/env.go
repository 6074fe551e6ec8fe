package k8stest

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// processSpec is what runs for a container.
type processSpec struct {
	argv []string
	env  []string
	dir  string
	log  *os.File // the container's output, appended across restarts
	// claims are the container's mounts of the node's claims
	// (NodeConfig.Claims): it runs in a mount namespace of its own.
	claims claimMounts
}

// configError is a container the kubelet would not start for want of a
// Secret, ConfigMap or key: volume reports a volume that cannot be set up.
type configError struct {
	msg    string
	volume bool
}

func (e *configError) Error() string { return e.msg }

// mountedPath is a volumeMount: where the container expects it, and the
// folder of the pod's that holds it.
type mountedPath struct{ path, host string }

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// prepare sets up the container's volumes and resolves its command, env
// and working directory, reading Secrets and ConfigMaps afresh.
func (p *provider) prepare(r *podRun, c corev1.Container, img Image) (*processSpec, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	p.mu.Lock()
	pod := r.pod.DeepCopy()
	p.mu.Unlock()

	home := filepath.Join(r.dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	mounts, claims, err := p.mountVolumes(ctx, r, pod, c)
	if err != nil {
		return nil, err
	}

	e := &envList{vars: map[string]string{}}
	e.set("PATH", defaultPath)
	for _, kv := range img.Env {
		k, v, _ := strings.Cut(kv, "=")
		e.set(k, v)
	}
	e.set("HOSTNAME", pod.Name)
	e.set("HOME", home)
	for _, from := range c.EnvFrom {
		data, err := p.envFromSource(ctx, pod.Namespace, from)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			e.set(from.Prefix+k, data[k])
		}
	}
	for _, ev := range c.Env {
		if ev.ValueFrom == nil {
			e.set(ev.Name, expand(ev.Value, e.vars))
			continue
		}
		v, ok, err := p.envValueFrom(ctx, pod, c, ev)
		if err != nil {
			return nil, err
		}
		if ok {
			e.set(ev.Name, v)
		}
	}

	argv := append([]string{}, c.Command...)
	if len(argv) == 0 {
		argv = append(argv, img.Entrypoint...)
	}
	argv = append(argv, c.Args...)
	if len(argv) == 0 {
		return nil, &configError{msg: "no command specified"}
	}
	for i := range argv {
		argv[i] = rewritePaths(expand(argv[i], e.vars), mounts)
	}
	env := make([]string, 0, len(e.order))
	for _, k := range e.order {
		env = append(env, k+"="+rewritePaths(e.vars[k], mounts))
	}
	dir := home
	if c.WorkingDir != "" {
		if w := rewritePaths(c.WorkingDir, mounts); w != c.WorkingDir {
			dir = w
		} else if claims.at(c.WorkingDir) {
			claims.workDir = c.WorkingDir // entered once mounted
		}
	}
	logFile, err := os.OpenFile(filepath.Join(r.dir, c.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &processSpec{argv: argv, env: env, dir: dir, log: logFile, claims: claims}, nil
}

// envList keeps env in the order it was first set, later values winning.
type envList struct {
	order []string
	vars  map[string]string
}

func (e *envList) set(k, v string) {
	if _, ok := e.vars[k]; !ok {
		e.order = append(e.order, k)
	}
	e.vars[k] = v
}

func (p *provider) envFromSource(ctx context.Context, ns string, from corev1.EnvFromSource) (map[string]string, error) {
	switch {
	case from.ConfigMapRef != nil:
		cm, err := p.client.CoreV1().ConfigMaps(ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
				return nil, nil
			}
			return nil, lookupError(err, "configmap", from.ConfigMapRef.Name)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, err := p.client.CoreV1().Secrets(ns).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
				return nil, nil
			}
			return nil, lookupError(err, "secret", from.SecretRef.Name)
		}
		out := map[string]string{}
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	}
	return nil, nil
}

// lookupError is the kubelet's message for a missing object, or the
// error itself when the lookup failed otherwise.
func lookupError(err error, kind, name string) error {
	if apierrors.IsNotFound(err) {
		return &configError{msg: fmt.Sprintf("%s %q not found", kind, name)}
	}
	return err
}

// envValueFrom resolves one valueFrom; ok is false for an optional value
// that is absent.
func (p *provider) envValueFrom(ctx context.Context, pod *corev1.Pod, c corev1.Container, ev corev1.EnvVar) (string, bool, error) {
	from := ev.ValueFrom
	switch {
	case from.FieldRef != nil:
		v, err := podField(pod, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := resourceValue(pod, c, from.ResourceFieldRef)
		return v, err == nil, err
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := p.client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", false, nil
			}
			return "", false, lookupError(err, "secret", ref.Name)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional {
				return "", false, nil
			}
			return "", false, &configError{msg: fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)}
		}
		return string(v), true, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := p.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", false, nil
			}
			return "", false, lookupError(err, "configmap", ref.Name)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional {
				return "", false, nil
			}
			return "", false, &configError{msg: fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)}
		}
		return v, true, nil
	}
	return "", false, &configError{msg: fmt.Sprintf("env %s: unsupported valueFrom", ev.Name)}
}

// podField resolves a downward API field path, as the kubelet does.
func podField(pod *corev1.Pod, path string) (string, error) {
	if k, ok := bracketKey(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := bracketKey(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		return "127.0.0.1", nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return pod.Status.PodIP, nil
	}
	return "", &configError{msg: fmt.Sprintf("unsupported fieldPath: %s", path)}
}

// bracketKey parses prefix['key'].
func bracketKey(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok || !strings.HasSuffix(rest, "']") {
		return "", false
	}
	return strings.TrimSuffix(rest, "']"), true
}

// resourceValue resolves a resourceFieldRef; an unset limit is the
// node's capacity.
func resourceValue(pod *corev1.Pod, c corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	target := c
	if ref.ContainerName != "" {
		for _, x := range pod.Spec.Containers {
			if x.Name == ref.ContainerName {
				target = x
			}
		}
	}
	var q resource.Quantity
	kind, name, _ := strings.Cut(ref.Resource, ".")
	list := target.Resources.Requests
	if kind == "limits" {
		list = target.Resources.Limits
	}
	if v, ok := list[corev1.ResourceName(name)]; ok {
		q = v
	} else if kind == "limits" {
		switch name {
		case "cpu":
			q = *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)
		case "memory":
			q = resource.MustParse("16Gi")
		}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if name == "cpu" {
		return fmt.Sprint(int64(math.Ceil(float64(q.MilliValue()) / float64(divisor.MilliValue())))), nil
	}
	return fmt.Sprint(int64(math.Ceil(float64(q.Value()) / float64(divisor.Value())))), nil
}

// expand replaces $(VAR) with the value of an already defined VAR, leaves
// an undefined one as it is, and turns $$ into $ (Kubernetes' rules).
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			switch s[i+1] {
			case '$':
				b.WriteByte('$')
				i++
				continue
			case '(':
				if end := strings.IndexByte(s[i+2:], ')'); end >= 0 {
					if v, ok := vars[s[i+2:i+2+end]]; ok {
						b.WriteString(v)
					} else {
						b.WriteString(s[i : i+3+end])
					}
					i += 2 + end
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountVolumes writes the Secret and ConfigMap volumes the container
// mounts into the pod's folder and returns where each mount is.
// The mounts of the node's claims (PersistentVolumeClaim volumes of
// NodeConfig.Claims) are real: they are in claims, not rewritten.
func (p *provider) mountVolumes(ctx context.Context, r *podRun, pod *corev1.Pod, c corev1.Container) ([]mountedPath, claimMounts, error) {
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	var mounts []mountedPath
	var claims claimMounts
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			continue
		}
		if pvc := v.PersistentVolumeClaim; pvc != nil && p.claims[pvc.ClaimName] != "" {
			root := p.claims[pvc.ClaimName]
			host := filepath.Join(root, filepath.Clean("/"+m.SubPath))
			// A kubelet makes a subPath that is not there yet.
			if err := os.MkdirAll(host, 0o755); err != nil {
				return nil, claims, err
			}
			claims.binds = append(claims.binds, mountedPath{path: filepath.Clean(m.MountPath), host: host})
			continue
		}
		dir := filepath.Join(r.dir, "volumes", m.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, claims, err
		}
		files, mode, err := p.volumeFiles(ctx, pod.Namespace, v)
		if err != nil {
			return nil, claims, err
		}
		for rel, data := range files {
			path := filepath.Join(dir, filepath.Clean("/"+rel))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, claims, err
			}
			if err := os.WriteFile(path, data, mode); err != nil {
				return nil, claims, err
			}
		}
		host := dir
		if m.SubPath != "" {
			host = filepath.Join(dir, filepath.Clean("/"+m.SubPath))
		}
		mounts = append(mounts, mountedPath{path: filepath.Clean(m.MountPath), host: host})
	}
	for _, root := range p.claims {
		claims.hide(root)
	}
	sort.Strings(claims.hidden)
	// Longest first, so a mount inside another wins.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].path) > len(mounts[j].path) })
	return mounts, claims, nil
}

// volumeFiles returns the files of a Secret or ConfigMap volume (none for
// other kinds, which are empty folders).
func (p *provider) volumeFiles(ctx context.Context, ns string, v corev1.Volume) (map[string][]byte, os.FileMode, error) {
	mode := os.FileMode(0o644)
	var data map[string][]byte
	var items []corev1.KeyToPath
	var optional bool
	var name string
	switch {
	case v.Secret != nil:
		name, items = v.Secret.SecretName, v.Secret.Items
		optional = v.Secret.Optional != nil && *v.Secret.Optional
		if v.Secret.DefaultMode != nil {
			mode = os.FileMode(*v.Secret.DefaultMode)
		}
		s, err := p.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return nil, mode, nil
			}
			return nil, mode, volumeError(err, v.Name, "secret", name)
		}
		data = s.Data
	case v.ConfigMap != nil:
		name, items = v.ConfigMap.Name, v.ConfigMap.Items
		optional = v.ConfigMap.Optional != nil && *v.ConfigMap.Optional
		if v.ConfigMap.DefaultMode != nil {
			mode = os.FileMode(*v.ConfigMap.DefaultMode)
		}
		cm, err := p.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return nil, mode, nil
			}
			return nil, mode, volumeError(err, v.Name, "configmap", name)
		}
		data = map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			data[k] = b
		}
	default:
		return nil, mode, nil
	}
	if len(items) == 0 {
		return data, mode, nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, mode, &configError{volume: true, msg: fmt.Sprintf("MountVolume.SetUp failed for volume %q : configmap references non-existent config key: %s", v.Name, it.Key)}
		}
		out[it.Path] = b
	}
	return out, mode, nil
}

func volumeError(err error, volume, kind, name string) error {
	if apierrors.IsNotFound(err) {
		return &configError{volume: true, msg: fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s %q not found", volume, kind, name)}
	}
	return err
}

// rewritePaths replaces each mountPath in s that stands as a path of its
// own (at the start, or after a space, '=', ':' or quote, and followed by
// the end, '/', a space or a quote) with the folder that holds it, in one
// pass, so a folder is never rewritten again. mounts are longest first.
func rewritePaths(s string, mounts []mountedPath) string {
	if len(mounts) == 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if i == 0 || strings.ContainsRune(" =:'\"", rune(s[i-1])) {
			if m, ok := mountAt(s[i:], mounts); ok {
				b.WriteString(m.host)
				i += len(m.path)
				continue
			}
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}

func mountAt(s string, mounts []mountedPath) (mountedPath, bool) {
	for _, m := range mounts {
		if m.path == "/" || !strings.HasPrefix(s, m.path) {
			continue
		}
		if len(s) == len(m.path) || strings.ContainsRune("/ '\"", rune(s[len(m.path)])) {
			return m, true
		}
	}
	return mountedPath{}, false
}
