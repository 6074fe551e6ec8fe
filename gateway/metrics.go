package gateway

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kernelgate/runs"
	"kernelgate/sessions"
)

// Metrics are kernelgate's Prometheus metrics. Label values are kernelspec
// names, languages, reasons and directions: never ids.
type Metrics struct {
	reg *prometheus.Registry

	kernelStarts   *prometheus.CounterVec
	kernelFailures *prometheus.CounterVec
	startLatency   *prometheus.HistogramVec
	restarts       *prometheus.CounterVec
	deaths         *prometheus.CounterVec
	culled         *prometheus.CounterVec
	poolTakes      *prometheus.CounterVec
	runs           *prometheus.CounterVec
	runLatency     *prometheus.HistogramVec
	truncations    *prometheus.CounterVec
	wsMessages     *prometheus.CounterVec
	wsBytes        *prometheus.CounterVec
	requests       *prometheus.CounterVec
}

// NewMetrics registers the metrics, with the Go runtime and process
// collectors, in a registry of their own.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m.kernelStarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_kernel_starts_total", Help: "Kernel processes started, by kernelspec."}, []string{"spec"})
	m.kernelFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_kernel_start_failures_total", Help: "Kernel starts that failed, by kernelspec."}, []string{"spec"})
	m.startLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kernelgate_kernel_start_seconds", Help: "Time from launch to a ready kernel.",
		Buckets: []float64{0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30}}, []string{"spec"})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_kernel_restarts_total", Help: "Kernel restarts, by kernelspec and cause (died, requested)."}, []string{"spec", "cause"})
	m.deaths = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_kernel_deaths_total", Help: "Kernel processes that died unasked, by kernelspec."}, []string{"spec"})
	m.culled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_kernels_culled_total", Help: "Idle kernels shut down by the culler."}, []string{"spec"})
	m.poolTakes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_pool_takes_total", Help: "New contexts and isolated runs served from the warm pool (hit) or by a cold start (miss)."}, []string{"spec", "result"})
	m.runs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_executes_total", Help: "Finished runs of the code-interpreter API, by language and process.reason."}, []string{"language", "reason"})
	m.runLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kernelgate_execute_seconds", Help: "Time from a run's arrival to its end, queueing included.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}, []string{"language"})
	m.truncations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_output_truncations_total", Help: "Runs whose output passed the per-run limits."}, []string{"language"})
	m.wsMessages = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_websocket_messages_total", Help: "Kernel messages forwarded over websockets, by direction."}, []string{"direction"})
	m.wsBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_websocket_bytes_total", Help: "Bytes of kernel messages forwarded over websockets, by direction."}, []string{"direction"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kernelgate_http_requests_total", Help: "HTTP requests, by route pattern and status code."}, []string{"route", "code"})
	for _, c := range []prometheus.Collector{m.kernelStarts, m.kernelFailures, m.startLatency, m.restarts, m.deaths, m.culled,
		m.poolTakes, m.runs, m.runLatency, m.truncations, m.wsMessages, m.wsBytes, m.requests,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}

var _ sessions.Observer = (*Metrics)(nil)

func (m *Metrics) KernelStarted(spec string, took time.Duration, err error) {
	if err != nil {
		m.kernelFailures.WithLabelValues(spec).Inc()
		return
	}
	m.kernelStarts.WithLabelValues(spec).Inc()
	m.startLatency.WithLabelValues(spec).Observe(took.Seconds())
}
func (m *Metrics) KernelRestarted(spec, cause string) { m.restarts.WithLabelValues(spec, cause).Inc() }
func (m *Metrics) KernelDied(spec string)             { m.deaths.WithLabelValues(spec).Inc() }
func (m *Metrics) KernelCulled(spec string)           { m.culled.WithLabelValues(spec).Inc() }
func (m *Metrics) PoolTaken(spec string, hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	m.poolTakes.WithLabelValues(spec, result).Inc()
}
func (m *Metrics) RunEnded(language string, reason runs.Reason, took time.Duration, truncated bool) {
	m.runs.WithLabelValues(language, string(reason)).Inc()
	m.runLatency.WithLabelValues(language).Observe(took.Seconds())
	if truncated {
		m.truncations.WithLabelValues(language).Inc()
	}
}

// stateCollector reports the gauges read from the manager at scrape time.
type stateCollector struct {
	s                                       *Server
	kernels, poolReady, queued, connections *prometheus.Desc
}

func newStateCollector(s *Server) *stateCollector {
	return &stateCollector{s: s,
		kernels:     prometheus.NewDesc("kernelgate_kernels", "Kernels by kernelspec and execution state.", []string{"spec", "state"}, nil),
		poolReady:   prometheus.NewDesc("kernelgate_pool_ready_kernels", "Ready kernels in the warm pool, by kernelspec.", []string{"spec"}, nil),
		queued:      prometheus.NewDesc("kernelgate_queued_runs", "Runs waiting in the contexts' queues.", nil, nil),
		connections: prometheus.NewDesc("kernelgate_websocket_connections", "Open kernel websockets.", nil, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.kernels
	ch <- c.poolReady
	ch <- c.queued
	ch <- c.connections
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, kc := range c.s.mgr.KernelCounts() {
		ch <- prometheus.MustNewConstMetric(c.kernels, prometheus.GaugeValue, float64(kc.N), kc.Spec, kc.State)
	}
	for _, p := range c.s.mgr.WarmPools().Stats() {
		ch <- prometheus.MustNewConstMetric(c.poolReady, prometheus.GaugeValue, float64(p.Ready), p.Spec)
	}
	ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(c.s.mgr.QueuedRuns()))
	c.s.mu.Lock()
	n := len(c.s.conns)
	c.s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.connections, prometheus.GaugeValue, float64(n))
}

func (s *Server) metricsHandler() echo.HandlerFunc {
	h := promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})
	return echo.WrapHandler(h)
}

// healthz answers while the process serves.
func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 when kernels can be started, 503 with the reasons
// otherwise (and from the moment a replica starts handing its kernels
// over as it stops).
func (s *Server) readyz(c echo.Context) error {
	if s.mgr.Leaving() {
		return c.JSON(http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "problems": []string{"this replica is stopping: it hands its kernels over to the other replicas"}})
	}
	if problems := s.mgr.Catalog().Ready(); len(problems) > 0 {
		return c.JSON(http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "problems": problems})
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}
