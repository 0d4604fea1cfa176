"""The demo training job of dist-resume, its records and their verification
(``dist-resume demo``), and the torchft demo (``--torchft``: a lighthouse and replica groups
under ``ManagedLoader``, killed and restarted on cue, their records counted). A user of the
package: imports its public face (`dist_resume`), `checkpoint`, the torchft integration, and
the loader and epoch order it checks the records against; only `cli` imports it."""
