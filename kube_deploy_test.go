package main

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"kernelgate/kernelspecs"
	kubeprov "kernelgate/provision/kubernetes"
	"kernelgate/state"
)

// The manifests of deploy/kubernetes parse strictly as their kinds and
// fit together: the Deployment runs as the ServiceAccount the RoleBinding
// binds to the Role (the very Role TestKubernetes gives the gateway),
// which grants pods, pods/status, pods/exec and secrets only; the
// NetworkPolicy lets only the gateway reach the kernel pods' ports; the ConfigMap's
// kernelspecs are valid kubernetes-provisioner configs; the gateway's
// args parse, and its state store is somewhere it can write.
func TestDeployManifests(t *testing.T) {
	var (
		sa      corev1.ServiceAccount
		role    rbacv1.Role
		binding rbacv1.RoleBinding
		dep     appsv1.Deployment
		svc     corev1.Service
		np      networkingv1.NetworkPolicy
		cm      corev1.ConfigMap
		pdb     policyv1.PodDisruptionBudget
		pvc     corev1.PersistentVolumeClaim
	)
	targets := map[string]any{"ServiceAccount": &sa, "Role": &role, "RoleBinding": &binding, "Deployment": &dep,
		"Service": &svc, "NetworkPolicy": &np, "ConfigMap": &cm, "PodDisruptionBudget": &pdb, "PersistentVolumeClaim": &pvc}
	seen := map[string]bool{}
	files, _ := filepath.Glob("deploy/kubernetes/*.yaml")
	for _, f := range files {
		if strings.HasSuffix(f, "kustomization.yaml") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(b, []byte("\n---\n")) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			target, ok := targets[meta.Kind]
			if !ok {
				t.Fatalf("%s: unexpected kind %q", f, meta.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, target); err != nil {
				t.Fatalf("%s %s: %v", f, meta.Kind, err)
			}
			seen[meta.Kind] = true
		}
	}
	for k := range targets {
		if !seen[k] {
			t.Errorf("no %s in deploy/kubernetes", k)
		}
	}
	kust, _ := os.ReadFile("deploy/kubernetes/kustomization.yaml")
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !strings.Contains(string(kust), base) {
			t.Errorf("kustomization.yaml misses %s", base)
		}
	}

	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name || binding.Subjects[0].Name != sa.Name || binding.RoleRef.Name != role.Name || binding.RoleRef.Kind != "Role" {
		t.Errorf("Deployment, ServiceAccount, RoleBinding and Role do not fit: %q %q %+v", dep.Spec.Template.Spec.ServiceAccountName, sa.Name, binding)
	}
	var exec []string
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			if res == "pods/exec" {
				exec = append(exec, r.Verbs...)
			}
			if !slices.Contains([]string{"pods", "pods/status", "pods/exec", "secrets"}, res) || len(r.APIGroups) != 1 || r.APIGroups[0] != "" {
				t.Errorf("the Role grants %v %v", r.APIGroups, res)
			}
			if slices.Contains(r.Verbs, "*") {
				t.Errorf("the Role grants every verb on %s", res)
			}
		}
	}
	// Commands beside a kernel exec in its pod: create (SPDY) and get
	// (websocket), nothing more.
	slices.Sort(exec)
	if !slices.Equal(exec, []string{"create", "get"}) {
		t.Errorf("the Role grants %v on pods/exec, want create and get", exec)
	}
	gw := dep.Spec.Template.Labels
	if !labelsMatch(svc.Spec.Selector, gw) {
		t.Errorf("the Service does not select the gateway: %v", svc.Spec.Selector)
	}
	kernel := map[string]string{kubeprov.LabelManagedBy: "kernelgate", kubeprov.LabelComponent: "kernel"}
	if !labelsMatch(np.Spec.PodSelector.MatchLabels, kernel) || len(np.Spec.Ingress) != 1 ||
		!labelsMatch(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, gw) {
		t.Errorf("the NetworkPolicy does not let only the gateway in to kernel pods: %+v", np.Spec)
	}
	port := np.Spec.Ingress[0].Ports[0]
	if port.Port.IntValue() != kubeprov.Ports[0] || port.EndPort == nil || int(*port.EndPort) != kubeprov.Ports[4] {
		t.Errorf("NetworkPolicy ports %v-%v, want %d-%d", port.Port, port.EndPort, kubeprov.Ports[0], kubeprov.Ports[4])
	}
	if len(cm.Data) == 0 {
		t.Error("no kernelspecs in the ConfigMap")
	}
	for key, js := range cm.Data {
		dir := filepath.Join(t.TempDir(), strings.TrimSuffix(key, ".json"))
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "kernel.json"), []byte(js), 0o644)
		spec, err := kernelspecs.Parse(dir)
		if err == nil {
			_, err = kubeprov.ParseConfig(spec)
		}
		if err != nil {
			t.Errorf("ConfigMap %s: %v", key, err)
		}
	}

	// The gateway starts in its container: with a read-only root
	// filesystem, its state directory is memory or a writable volume.
	gwc := dep.Spec.Template.Spec.Containers[0]
	env := map[string]string{"HOME": "/home/nonroot"} // the image's user
	for _, e := range gwc.Env {
		env[e.Name] = cmp.Or(e.Value, "set-from-"+e.Name)
	}
	if _, ok := env["KERNELGATE_STATE_URL"]; ok {
		env["KERNELGATE_STATE_URL"] = "postgres://kernelgate@kernelgate-postgres/kernelgate" // as its Secret would
	}
	if len(gwc.Args) == 0 || gwc.Args[0] != "serve" {
		t.Fatalf("the gateway container runs %v, not serve", gwc.Args)
	}
	// The cluster secret's file is mounted from its Secret: here, a file
	// of the same kind.
	secretFile := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secretFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	args := slices.Clone(gwc.Args[1:])
	for i, a := range args {
		if strings.HasPrefix(a, "--cluster-secret-file=") {
			args[i] = "--cluster-secret-file=" + secretFile
		}
	}
	c, err := parseConfig(args, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("the gateway's args: %v", err)
	}
	dir, err := state.ResolveDir(c.StateDir, c.StateDirSet, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("the gateway's state dir: %v", err)
	}
	if sc := gwc.SecurityContext; dir != "" && sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		writable := false
		for _, m := range gwc.VolumeMounts {
			for _, v := range dep.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && !m.ReadOnly && (v.EmptyDir != nil || v.PersistentVolumeClaim != nil) &&
					(dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/")) {
					writable = true
				}
			}
		}
		if !writable {
			t.Errorf("the gateway keeps state in %s, which its read-only root filesystem does not let it write", dir)
		}
	}
	checkReplicas(t, &dep, &pdb, &pvc, c)
}

// checkReplicas: the Deployment runs three replicas on one PostgreSQL
// (the URL from a Secret), a PodDisruptionBudget keeps two of them, each
// is ready only once it serves (/readyz), advertises its pod IP, reads
// the cluster secret from a Secret's file, and keeps the workspaces on
// a ReadWriteMany claim; nothing cluster-wide is asked for.
func checkReplicas(t *testing.T, dep *appsv1.Deployment, pdb *policyv1.PodDisruptionBudget, pvc *corev1.PersistentVolumeClaim, c *config) {
	t.Helper()
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("the Deployment runs %d replicas, want 3", ptrOr(dep.Spec.Replicas, 1))
	}
	if dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		t.Error("the Deployment recreates: every replica stops at once")
	}
	gw := dep.Spec.Template.Labels
	if pdb.Spec.Selector == nil || !labelsMatch(pdb.Spec.Selector.MatchLabels, gw) {
		t.Errorf("the PodDisruptionBudget does not select the gateway: %+v", pdb.Spec.Selector)
	}
	if !(pdb.Spec.MaxUnavailable != nil && pdb.Spec.MaxUnavailable.IntValue() == 1) &&
		!(pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.IntValue() == 2) {
		t.Errorf("the PodDisruptionBudget allows %v unavailable, %v available; want at most 1 down of 3", pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
	gwc := dep.Spec.Template.Spec.Containers[0]
	if p := gwc.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v, want GET /readyz", p)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range gwc.Env {
		env[e.Name] = e
	}
	if e := env["KERNELGATE_STATE_URL"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
		t.Errorf("KERNELGATE_STATE_URL %+v, want it from a Secret", e)
	}
	if c.StateURL == "" {
		t.Error("the gateway's state is not in PostgreSQL")
	}
	adv := env["KERNELGATE_ADVERTISE_URL"].Value
	ipVar := ""
	for name, e := range env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
			ipVar = name
		}
	}
	if ipVar == "" || !strings.Contains(adv, "$("+ipVar+")") {
		t.Errorf("KERNELGATE_ADVERTISE_URL %q is not the pod IP (downward API status.podIP)", adv)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	mountedFrom := func(path string) (corev1.Volume, bool) {
		for _, m := range gwc.VolumeMounts {
			if path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/") {
				return volumes[m.Name], true
			}
		}
		return corev1.Volume{}, false
	}
	if c.ClusterSecretFile == "" {
		t.Error("no --cluster-secret-file")
	}
	for _, a := range gwc.Args {
		if f, ok := strings.CutPrefix(a, "--cluster-secret-file="); ok {
			if v, ok := mountedFrom(f); !ok || v.Secret == nil {
				t.Errorf("--cluster-secret-file %s is not mounted from a Secret", f)
			}
		}
	}
	if v, ok := mountedFrom(c.WorkspaceRoot); c.WorkspaceRoot == "" || !ok || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != pvc.Name {
		t.Errorf("--workspace-root %q is not on the claim %s", c.WorkspaceRoot, pvc.Name)
	}
	// Kernel pods mount their context's folder of the claim: the claim
	// must be --workspace-root itself, for its sub-paths to be the
	// contexts' folders.
	rootMounted := slices.ContainsFunc(gwc.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.MountPath == c.WorkspaceRoot && m.SubPath == "" && volumes[m.Name].PersistentVolumeClaim != nil
	})
	if c.KernelWorkspaceClaim != pvc.Name || !rootMounted {
		t.Errorf("--kernel-workspace-claim %q with the claim mounted at --workspace-root: %v; want claim %s mounted there", c.KernelWorkspaceClaim, rootMounted, pvc.Name)
	}
	if !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
		t.Errorf("the workspaces' claim is %v, want ReadWriteMany (every replica mounts it)", pvc.Spec.AccessModes)
	}
}

// ptrOr is *p, or def when p is nil.
func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// labelsMatch says whether selector selects labels.
func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestConfigProvisioners(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseConfig(nil, none, &bytes.Buffer{})
	if err != nil || c.DefaultProvisioner != "local-provisioner" || c.Release != "kernelgate" || c.Kubeconfig != "" {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	env := map[string]string{"KERNELGATE_KUBECONFIG": "/k", "KERNELGATE_KUBERNETES_NAMESPACE": "ns", "KERNELGATE_RELEASE": "blue"}
	c, err = parseConfig([]string{"--default-provisioner", "kubernetes-provisioner"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil || c.DefaultProvisioner != "kubernetes-provisioner" || c.Kubeconfig != "/k" || c.KubeNamespace != "ns" || c.Release != "blue" {
		t.Errorf("flags and env: %+v %v", c, err)
	}
	if _, err := parseConfig([]string{"--default-provisioner", "docker"}, none, &bytes.Buffer{}); err == nil {
		t.Error("an unknown provisioner accepted")
	}
	if _, err := parseConfig([]string{"--release", ""}, none, &bytes.Buffer{}); err == nil {
		t.Error("an empty release accepted")
	}
}
