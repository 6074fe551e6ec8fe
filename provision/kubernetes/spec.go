// Package kubernetes is kernelgate's kubernetes-provisioner: one pod per
// kernel, built as typed objects from the kernelspec's
// metadata.kernel_provisioner.config, watched through an informer, with
// the connection key in a Secret and labels and annotations that let a
// gateway started anywhere find its kernels again from the API server
// alone (docs/kubernetes.md).
package kubernetes

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
)

// Labels and annotations of kernel pods and their Secrets.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelComponent = "app.kubernetes.io/component"
	LabelRelease   = "kernelgate.io/release"
	LabelKernelID  = "kernelgate.io/kernel-id"
	LabelKind      = "kernelgate.io/kind"
	// LabelReplica names the replica that created the pod (with
	// replicas: Provisioner.Replica).
	LabelReplica   = "kernelgate.io/replica"
	AnnotationSpec = "kernelgate.io/kernelspec"
	AnnotationEnv  = "kernelgate.io/env"

	managedBy = "kernelgate"
	// SecretKey is the Secret's key holding the connection key.
	SecretKey = "key"
	container = "kernel"
	// terminationGrace is the seconds a kernel pod has to stop, from
	// SIGTERM to SIGKILL.
	terminationGrace int64 = 5
)

// Ports are the kernel's fixed ports on its own pod IP: shell, iopub,
// stdin, control, heartbeat.
var Ports = [5]int{52700, 52701, 52702, 52703, 52704}

// Environment of the launcher (kernelgate kernel-entry) in the pod.
const (
	EnvIP     = "KERNELGATE_KERNEL_IP"
	EnvKey    = "KERNELGATE_KERNEL_KEY"
	EnvPorts  = "KERNELGATE_KERNEL_PORTS"
	EnvName   = "KERNELGATE_KERNEL_NAME"
	EnvScheme = "KERNELGATE_SIGNATURE_SCHEME"
)

// SpecConfig is a kernelspec's metadata.kernel_provisioner.config for
// kubernetes-provisioner. Field names of Kubernetes types are as in a pod
// manifest (camelCase).
type SpecConfig struct {
	// Image runs the kernel; required.
	Image           string            `json:"image"`
	ImagePullPolicy corev1.PullPolicy `json:"image_pull_policy,omitempty"`
	// Command is the launcher that writes the connection file and execs
	// the kernel; default the provisioner's (kernelgate kernel-entry).
	Command []string `json:"command,omitempty"`
	// Argv is the kernel's command line in the image, with
	// {connection_file}; default the kernelspec's argv.
	Argv      []string                    `json:"argv,omitempty"`
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// NodeSelector and Tolerations place the pod.
	NodeSelector map[string]string   `json:"node_selector,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
	// ServiceAccount runs the pod; its token is never mounted.
	ServiceAccount string `json:"service_account,omitempty"`
	// SecurityContext replaces the default (non-root, no privilege
	// escalation, no capabilities, RuntimeDefault seccomp).
	SecurityContext *corev1.SecurityContext `json:"security_context,omitempty"`
	// Env is added to the kernel's environment.
	Env map[string]string `json:"env,omitempty"`
	// SecretEnv sets variables from Secrets: NAME → "secret/key".
	SecretEnv map[string]string `json:"secret_env,omitempty"`
}

// ParseConfig reads spec's kubernetes-provisioner config.
func ParseConfig(spec *kernelspecs.Spec) (*SpecConfig, error) {
	choice, err := jupyter.ChoiceOf(spec)
	if err != nil {
		return nil, err
	}
	cfg := &SpecConfig{}
	if len(choice.Config) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(choice.Config)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(cfg); err != nil {
			return nil, fmt.Errorf("kernelspec %s: kubernetes-provisioner config: %w", spec.Name, err)
		}
	}
	if cfg.Image == "" {
		return nil, fmt.Errorf("kernelspec %s: kubernetes-provisioner config names no image", spec.Name)
	}
	for name, ref := range cfg.SecretEnv {
		if s, k, ok := strings.Cut(ref, "/"); !ok || s == "" || k == "" {
			return nil, fmt.Errorf("kernelspec %s: secret_env %s: want \"secret/key\", not %q", spec.Name, name, ref)
		}
	}
	return cfg, nil
}

// podName is a new pod's name: the kernel id's first part and a random
// suffix, so a restarted kernel's new pod never waits for the old name.
func podName(kernelID string) string {
	short := kernelID
	if len(short) > 8 {
		short = short[:8]
	}
	const letters = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 5)
	rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return strings.ToLower("kernel-" + strings.Trim(short, "-") + "-" + string(b))
}

// podParams is what a kernel pod is built from.
type podParams struct {
	Name, Namespace, Release string
	KernelID, Kind           string
	Replica                  string // "" without replicas
	Spec                     *kernelspecs.Spec
	Config                   *SpecConfig
	Env                      map[string]string // the request's allowed env
	MemoryBytes              int64
	// Workspace is the folder of the workspace claim the kernel mounts,
	// nil for none; DirEnv the gateway's variables naming folders in it.
	Workspace *workspaceVolume
	DirEnv    map[string]string
}

// workspaceVolume is a kernel's folder of the workspace claim: SubPath of
// Claim mounted at Path (the same path as in the gateway); Enter starts
// the kernel there.
type workspaceVolume struct {
	Claim, SubPath, Path string
	Enter                bool
}

// workspaceVolumeName is the pod's volume of the workspace claim.
const workspaceVolumeName = "workspace"

func (pp podParams) labels() map[string]string {
	kind := pp.Kind
	if kind == "" {
		kind = "jupyter"
	}
	l := map[string]string{
		LabelManagedBy: managedBy,
		LabelComponent: "kernel",
		LabelRelease:   pp.Release,
		LabelKernelID:  pp.KernelID,
		LabelKind:      kind,
	}
	if pp.Replica != "" {
		l[LabelReplica] = pp.Replica
	}
	return l
}

func ptr[T any](v T) *T { return &v }

// buildPod returns the kernel's pod. Nothing of the request is
// interpreted as text: values go into typed fields only.
func buildPod(pp podParams) (*corev1.Pod, error) {
	cfg := pp.Config
	argv, specEnv := pp.Spec.Command("{connection_file}", nil)
	if len(cfg.Argv) > 0 {
		argv = cfg.Argv
	}
	command := cfg.Command
	if len(command) == 0 {
		command = []string{"kernelgate", "kernel-entry"}
	}
	envJSON, err := json.Marshal(pp.Env)
	if err != nil {
		return nil, err
	}
	ports := make([]string, len(Ports))
	for i, p := range Ports {
		ports[i] = strconv.Itoa(p)
	}
	env := []corev1.EnvVar{
		{Name: EnvIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: EnvKey, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: pp.Name}, Key: SecretKey}}},
		{Name: EnvPorts, Value: strings.Join(ports, ",")},
		{Name: EnvName, Value: pp.Spec.Name},
		{Name: EnvScheme, Value: "hmac-sha256"},
	}
	env = append(env, sortedEnv(specEnv)...)
	env = append(env, sortedEnv(cfg.Env)...)
	env = append(env, sortedEnv(pp.Env)...)
	env = append(env, sortedEnv(pp.DirEnv)...)
	names := make([]string, 0, len(cfg.SecretEnv))
	for n := range cfg.SecretEnv {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s, k, _ := strings.Cut(cfg.SecretEnv[n], "/")
		env = append(env, corev1.EnvVar{Name: n, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: s}, Key: k}}})
	}

	res := *cfg.Resources.DeepCopy()
	if pp.MemoryBytes > 0 {
		if _, set := res.Limits[corev1.ResourceMemory]; !set {
			if res.Limits == nil {
				res.Limits = corev1.ResourceList{}
			}
			res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(pp.MemoryBytes, resource.BinarySI)
		}
	}
	sc := cfg.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{
			RunAsNonRoot:             ptr(true),
			AllowPrivilegeEscalation: ptr(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
	}
	var cports []corev1.ContainerPort
	for i, name := range []string{"shell", "iopub", "stdin", "control", "hb"} {
		cports = append(cports, corev1.ContainerPort{Name: name, ContainerPort: int32(Ports[i]), Protocol: corev1.ProtocolTCP})
	}
	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	workDir := ""
	if ws := pp.Workspace; ws != nil {
		volumes = []corev1.Volume{{Name: workspaceVolumeName, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ws.Claim}}}}
		mounts = []corev1.VolumeMount{{Name: workspaceVolumeName, MountPath: ws.Path, SubPath: ws.SubPath}}
		if ws.Enter {
			workDir = ws.Path
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pp.Name, Namespace: pp.Namespace,
			Labels: pp.labels(),
			Annotations: map[string]string{
				AnnotationSpec: pp.Spec.Name,
				AnnotationEnv:  string(envJSON),
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr(terminationGrace),
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			ServiceAccountName:            cfg.ServiceAccount,
			NodeSelector:                  cfg.NodeSelector,
			Tolerations:                   cfg.Tolerations,
			SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)},
			Volumes:                       volumes,
			Containers: []corev1.Container{{
				Name:                     container,
				Image:                    cfg.Image,
				ImagePullPolicy:          cfg.ImagePullPolicy,
				Command:                  command,
				Args:                     append([]string{"--"}, argv...),
				Env:                      env,
				Ports:                    cports,
				Resources:                res,
				SecurityContext:          sc,
				VolumeMounts:             mounts,
				WorkingDir:               workDir,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}, nil
}

func sortedEnv(m map[string]string) []corev1.EnvVar {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]corev1.EnvVar, 0, len(keys))
	for _, k := range keys {
		out = append(out, corev1.EnvVar{Name: k, Value: m[k]})
	}
	return out
}

// buildSecret is the Secret holding the kernel's connection key.
func buildSecret(pp podParams, key string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pp.Name, Namespace: pp.Namespace, Labels: pp.labels()},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{SecretKey: []byte(key)},
	}
}

// podInfo is the ProvisionerInfo of a kernel pod: how to find it again
// and reach its kernel.
func podInfo(d podData, ci jupyter.ConnInfo) jupyter.ProvisionerInfo {
	data, _ := json.Marshal(d) // strings only: it cannot fail
	return jupyter.ProvisionerInfo{Provisioner: Name, Connection: ci, Data: data}
}

// connInfo is how the gateway reaches the kernel of a pod at ip.
func connInfo(ip, key, kernelName string) jupyter.ConnInfo {
	return jupyter.ConnInfo{
		ShellPort: Ports[0], IOPubPort: Ports[1], StdinPort: Ports[2], ControlPort: Ports[3], HBPort: Ports[4],
		IP: ip, Key: key, Transport: "tcp", SignatureScheme: "hmac-sha256", KernelName: kernelName,
	}
}
