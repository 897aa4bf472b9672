package classify

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/metrics"
)

// ModelWatcher reloads a model file into Rules when the file changes: Check compares
// the file's modification time and size with those of the last file it read and, when
// they differ, loads it and hands it to Rules.SetModel. A file that does not load (cut,
// corrupt, missing) or lacks a label the rules match on leaves the model in use as it
// is, and is not read again until it changes again. Each reload is counted in
// kvroute_classify_model_reloads_total{outcome}: ok, error (the file did not load) or
// rejected (it lacks labels the rules use). Check and Run are for one goroutine.
type ModelWatcher struct {
	path   string
	stamp  fileStamp
	rules  *Rules
	counts *prometheus.CounterVec // nil: not counted
	log    *slog.Logger
}

type fileStamp struct {
	mtime int64 // UnixNano
	size  int64
	ok    bool // the file could be stat'ed
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mtime: fi.ModTime().UnixNano(), size: fi.Size(), ok: true}
}

// LoadWatched loads the model at path and returns it with a watcher for it. The file
// is stat'ed before it is read, so a change during the load is seen by the first Check.
// m (nil: not counted) and log (nil: slog.Default()) serve the reloads.
func LoadWatched(path string, m *metrics.Classify, log *slog.Logger) (*Linear, *ModelWatcher, error) {
	if log == nil {
		log = slog.Default()
	}
	w := &ModelWatcher{path: path, stamp: stampOf(path), log: log}
	if m != nil {
		w.counts = m.ModelReloads
	}
	model, err := Load(path)
	if err != nil {
		return nil, nil, err
	}
	return model, w, nil
}

// Watch makes Check reload into rs.
func (w *ModelWatcher) Watch(rs *Rules) { w.rules = rs }

// Check reloads the file if it changed since it was last read and returns the outcome:
// "unchanged", "ok", "error" or "rejected".
func (w *ModelWatcher) Check() string {
	st := stampOf(w.path)
	if st == w.stamp || !st.ok && !w.stamp.ok {
		return "unchanged"
	}
	w.stamp = st
	outcome := "ok"
	m, err := Load(w.path)
	if err != nil {
		outcome = "error"
		w.log.Warn("classify: model file not reloaded, the model in use is kept", "path", w.path, "err", err)
	} else if w.rules != nil {
		if err = w.rules.SetModel(m); err != nil {
			outcome = "rejected"
			w.log.Warn("classify: model file not reloaded, the model in use is kept", "path", w.path, "err", err)
		}
	}
	if err == nil {
		w.log.Info("classify: model reloaded", "path", w.path, "labels", len(m.Labels))
	}
	if w.counts != nil {
		w.counts.WithLabelValues(outcome).Inc()
	}
	return outcome
}

// Run calls Check every interval until ctx ends.
func (w *ModelWatcher) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Check()
		}
	}
}
