"""The demo training job of dist-resume, its records and their verification
(``dist-resume demo``). A user of the package: imports its public face (`dist_resume`),
`checkpoint`, and the loader and epoch order it checks the records against; only `cli`
imports it."""
