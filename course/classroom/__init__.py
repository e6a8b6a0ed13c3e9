"""The class grader behind ``python -m course grade-class``: every submission of a class graded in parallel, each
confined, resumable, into nbgrader's gradebook and plain files, with a report (README, "Instructor notes").

``grade_class`` runs a class; ``pool`` grades submissions by forks of a warm process, one per slot; ``confinement``
confines them (a bubblewrap sandbox per slot, namespaces per submission, cgroup limits); ``tampering`` flags what
reaches into the grader; ``inside`` is what a confined fork runs (the checks, or a notebook's
cells); ``gradebook`` records the notebook route with nbgrader's own autograde code; ``engines`` spreads a class
over a Dask cluster; ``report`` writes the class report; ``simulate`` writes a simulated class to try it on.
"""
