"""``python -m course grade-class`` against ``nbgrader autograde`` on a simulated class of lesson 14 notebooks:
wall time per ``--jobs``, seconds per submission, and whether every grade cell scores the same
(``course/classroom/benchmark.py`` says how).

    python labs/bench_grade_class.py --students 300 --jobs 2 1 --autograde 6
    python labs/bench_grade_class.py --students 12 --jobs 2 --autograde 3    # a quick look
"""
from course.classroom.benchmark import main

if __name__ == "__main__":
    main()
